"""Modules a site needs imported before anything imports torch.

On Polaris, Cray MPICH aborts a rank ("GPU_SUPPORT_ENABLED is requested, but GTL library is not
linked") when torch is loaded before MPI; ALCF's fix is to import mpi4py's MPI first (the site
profile's `import_first` says so, with its source). A study job names such modules in
HARNESS_IMPORT_FIRST, and `python -m harness` imports them in every rank before its command runs,
and mpi4py's MPI too wherever discovery will ask MPI for rank 0's host
(harness.process.discovery.import_mpi_first): wherever the kit imports mpi4py, torch comes after it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import require
from .discovery import import_mpi_first

IMPORT_FIRST_VARIABLE = "HARNESS_IMPORT_FIRST"


def import_first(environ: Mapping[str, str]) -> list[str]:
    """Import the modules HARNESS_IMPORT_FIRST names (commas between them), in order, then mpi4py's
    MPI where discovery will need it; the names imported. Raises UsageError naming the module when
    one cannot be imported."""
    names = [name.strip() for name in environ.get(IMPORT_FIRST_VARIABLE, "").split(",") if name.strip()]
    for name in names:
        require(
            name,
            f"{IMPORT_FIRST_VARIABLE}, which asks for {name} before torch,",
            f"install it in the job's Python, or unset {IMPORT_FIRST_VARIABLE}",
        )
    return [*names, *(["mpi4py.MPI"] if import_mpi_first(environ) else [])]

"""harness.workshop.engines: where engines go, the batch scripts that start them on compute nodes, and the
clean-up that a notebook (and the notebook tests) rely on so that no engine outlives its notebook."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.workshop.engines import (
    batch_script,
    default_placement,
)


@pytest.mark.parametrize(
    "gpus, engines, expected",
    [
        (0, None, (2, 1)),  # a laptop: two CPU ranks
        (1, None, (2, 2)),  # one GPU: two ranks share it
        (4, None, (4, 1)),  # a GPU node: one rank per GPU
        (4, 8, (8, 2)),
        (2, 3, (3, 2)),  # uneven: the busiest GPU holds two
        (0, 3, (3, 1)),
    ],
)
def test_default_placement(gpus: int, engines, expected) -> None:
    assert default_placement(gpus, engines) == expected


def test_no_engines_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="at least one engine"):
        default_placement(0, 0)


def test_batch_scripts_carry_directives_and_launch_arguments() -> None:
    slurm = batch_script("slurm", ["--account=proj", "--time=00:30:00"])
    assert "#SBATCH --account=proj\n#SBATCH --time=00:30:00\n" in slurm
    assert "srun  {program_and_args} --mpi" in slurm and "{n}" in slurm
    pbs = batch_script("pbs", ["-A proj", "-l select=2:system=polaris"], ["--ppn", "4"])
    assert "#PBS -A proj\n#PBS -l select=2:system=polaris\n" in pbs
    assert "mpiexec -n {n} --ppn 4 {program_and_args} --mpi" in pbs
    with pytest.raises(UsageError, match="lsf"):
        batch_script("lsf")

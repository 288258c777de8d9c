"""Study layer: many runs and what they show.

- `sweep`: a scaling study (backends x rank counts x repeats, weak or strong scaling) through a
  local launcher or the allocation's own (`srun`, `mpiexec`), resumable, one JSONL of records;
- `report`, `plot`: the Markdown table and the figures of a study's records;
- `equivalence`, `weights`: the bound within which a distributed run must train the weights of one
  process on the global batch, and the comparison of saved weights against it.

It reads records produced by the train layer; nothing here imports `workshop`.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "SweepSettings": "sweep", "SweepResult": "sweep", "run_sweep": "sweep",
    "scaling_report": "report", "markdown_table": "report", "RUN_COLUMNS": "report",
    "scaling_figures": "plot", "write_figures": "plot", "loss_figure": "plot", "timeline_figure": "plot",
    "EQUIVALENCE_STEPS": "equivalence", "UPDATE_BOUND": "equivalence",
    "initial_weights": "weights", "load_weights": "weights", "compare_with_reference": "weights",
    "comparison_bound": "weights", "comparison_table": "weights",
})
__all__ = __dir__()

"""Study layer: many runs and what they show.

- `sweep`: a scaling study (backends x rank counts x repeats, weak or strong scaling) through a
  local launcher or the allocation's own (`srun`, `mpiexec`), resumable, one JSONL of records;
- `report`, `plot`: the Markdown table and the figures of a study's records;
- `bench` (with `allreduce`, the model and its fit), `predict`: `harness bench allreduce` (any backend's allreduce per
  message size, NCCL's ring alpha-beta model fitted to it) and `harness predict` (step time,
  throughput and efficiency at 1..512 nodes of a site, beside measured runs); `recommend`: `harness
  recommend` (which backend cases fit a rank's memory at each node count, their predicted step, and
  the choice);
- `job` (with `sites`, `scheduler`, `settings`, `check`, `submit`, `continuation`, `preflight`,
  `network`, `placement`): a whole study as a batch job, `harness study`: the site's profile
  (harness/study/sites/*.json), the scheduler's view of the job, the checks before the queue
  (`--check`) and in the job, the site's NCCL/RCCL network plugin, discovery and the placement it
  shows, the sweep, figures and report, and the job's continuation after a warning or a preemption;
- `trace`: the per-rank summary and spans of a merged `harness train --profile-trace` trace (the
  training layer merges the ranks' traces into one, harness.training.trace); `run_plots` draws it;
- `intervals`: 95% intervals over interleaved repeats (of a mean, of a paired ratio) and whether two overlap;
- `task_spec`, `shapes`: the task every run of a sweep loads by name, which task a record
  trained, and the shape of a task's model that a prediction prices;
- `equivalence`, `weights`: the bound within which a distributed run must train the weights of one
  process on the global batch, and the comparison of saved weights against it.

It reads records produced by the train layer; nothing here imports `workshop`.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SweepSettings": "sweep",
        "SweepResult": "sweep",
        "run_sweep": "sweep",
        "scaling_report": "report",
        "markdown_table": "report",
        "RUN_COLUMNS": "report",
        "scaling_figures": "plot",
        "write_figures": "plot",
        "loss_figure": "run_plots",
        "timeline_figure": "run_plots",
        "trace_figure": "run_plots",
        "prediction_figure": "run_plots",
        "BenchSettings": "allreduce",
        "bench_allreduce": "bench",
        "fit_alpha_beta": "allreduce",
        "Network": "predict",
        "Workload": "predict",
        "predict_scaling": "predict",
        "network_from_site": "predict",
        "model_gradient_bytes": "shapes",
        "task_shape": "shapes",
        "prediction_table": "predict",
        "recommend": "recommend",
        "Recommendation": "recommend",
        "EQUIVALENCE_STEPS": "equivalence",
        "UPDATE_BOUND": "equivalence",
        "initial_weights": "weights",
        "load_weights": "weights",
        "compare_with_reference": "weights",
        "comparison_bound": "weights",
        "comparison_table": "weights",
        "run_study": "job",
        "check_study": "preflight",
        "CheckResult": "check",
        "StudySettings": "settings",
        "SiteProfile": "sites",
        "load_site": "sites",
        "site_names": "sites",
        "parse_walltime": "walltime",
        "trace_summary": "trace",
        "mean_interval": "intervals",
        "ratio_interval": "intervals",
        "MIN_ROUNDS": "intervals",
        "overlap": "intervals",
        "trace_spans": "trace",
    },
)
__all__ = __dir__()

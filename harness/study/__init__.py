"""Study layer: many runs and what they show, in four packages.

- `scaling`: a scaling study and what its records show. `sweep` (backends x rank counts x repeats,
  weak or strong scaling, through a local launcher or the allocation's own, resumable, one JSONL of
  records); `report` and `report_notes` (the Markdown table and its caveats), `plot` and
  `run_plots` (the figures of a study, of one run, of a prediction), `html_report`; `intervals`
  (95% intervals over interleaved repeats); `trace` (a merged profiler trace's per-rank summary);
  `equivalence` and `weights` (the bound within which a distributed run trains the weights of one
  process, and the comparison of saved weights against it); `task_spec` (the task every run of a
  sweep loads by name, and which task a record trained).
- `prediction`: what a study will show, said before it runs. `bench` with `allreduce` (`harness
  bench allreduce` and NCCL's ring alpha-beta model fitted to it), `nccl` (the algorithm and
  protocol NCCL's tuner picks), `stepmodel` (one rank's step laid out in time), `predict` and
  `predict_cli` (`harness predict`: step time, throughput and efficiency at 1..512 nodes of a site),
  `memory` (memory per rank, from the task's own activations), `recommend` (`harness recommend`:
  which backends fit, their predicted step, the choice), `shapes` (the task's model a prediction
  prices), `foresight` (a study's prediction written before its runs, set beside them after).
- `sites`: the site profiles (harness/study/sites/*.json: queues, launcher, modules, network, device
  memory, each fact with its source) and `walltime`, which both prediction and jobs read.
- `jobs`: a whole study as a batch job at a site, `harness study`. `settings`, `check` and `preflight` (what would fail
  in the queue, found before it), `submit`, `scheduler` (the batch system's view of the job, read as
  JSON), `job` and `jobdir` (the study inside the job), `network` (the site's NCCL/RCCL plugin),
  `placement` (where the ranks landed), `continuation` (after a warning or a preemption),
  `smoke` (the night before), `doctor` (what this node offers a run).

Prediction reads scaling's records and intervals and the sites' profiles; jobs runs all three;
scaling imports neither, but for the HTML report, which shows the prediction a job wrote beside
what its runs measured. It reads records produced by the train layer; nothing here imports
`workshop`.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SweepSettings": "scaling.sweep",
        "SweepResult": "scaling.sweep",
        "run_sweep": "scaling.sweep",
        "scaling_report": "scaling.report",
        "markdown_table": "scaling.report",
        "RUN_COLUMNS": "scaling.report",
        "scaling_figures": "scaling.plot",
        "write_figures": "scaling.plot",
        "loss_figure": "scaling.run_plots",
        "timeline_figure": "scaling.run_plots",
        "trace_figure": "scaling.run_plots",
        "prediction_figure": "scaling.run_plots",
        "BenchSettings": "prediction.allreduce",
        "bench_allreduce": "prediction.bench",
        "fit_alpha_beta": "prediction.allreduce",
        "Network": "prediction.predict",
        "Workload": "prediction.predict",
        "predict_scaling": "prediction.predict",
        "network_from_site": "prediction.predict",
        "model_gradient_bytes": "prediction.shapes",
        "task_shape": "prediction.shapes",
        "prediction_table": "prediction.predict",
        "recommend": "prediction.recommend",
        "Recommendation": "prediction.recommend",
        "EQUIVALENCE_STEPS": "scaling.equivalence",
        "UPDATE_BOUND": "scaling.equivalence",
        "initial_weights": "scaling.weights",
        "load_weights": "scaling.weights",
        "compare_with_reference": "scaling.weights",
        "comparison_bound": "scaling.weights",
        "comparison_table": "scaling.weights",
        "run_study": "jobs.job",
        "check_study": "jobs.preflight",
        "CheckResult": "jobs.check",
        "StudySettings": "jobs.settings",
        "SiteProfile": "sites",
        "load_site": "sites",
        "site_names": "sites",
        "parse_walltime": "sites.walltime",
        "trace_summary": "scaling.trace",
        "mean_interval": "scaling.intervals",
        "ratio_interval": "scaling.intervals",
        "MIN_ROUNDS": "scaling.intervals",
        "overlap": "scaling.intervals",
        "trace_spans": "scaling.trace",
    },
)
__all__ = __dir__()

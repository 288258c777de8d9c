"""Training layer: one run on this process's rank, from configuration to results record.

(The package is `harness.training`; `harness.train` is the function that runs one.)

- `loop`: `train(config)`, the one loop every backend runs (it never asks which backend it runs);
- `placement`: before a rank trains, `check_config` and the rank's backend, device and threads;
- `launch`: `harness launch`, N local ranks of `harness train` under a backend's launcher;
- `flags`: `harness train`'s flags, one per TrainConfig field and one per option of every backend;
- `plan`, `probe`: what a run will do, fixed before it starts, and its task tried on one batch on
  every rank before any process group exists;
- `checkpoint`, `callbacks`, `lr`, `timing`, `contention`, `metrics`, `evaluate`: what the loop
  needs (atomic checkpoints and exact resume, hooks, learning-rate rules, the timed window and step
  breakdown, how much of the CPU each rank had, the one definition of each metric, exact evaluation);
- `score`: `harness evaluate`, a saved model scored as a run evaluates;
- `profiling`, `trace`: `--profile-trace DIR`, each rank's profiler trace and rank 0's merge of them
  into one DIR/trace.json (`merge_traces`, also `harness trace merge`);
- `record`: the results record a run returns (`run_record`), appending it to a JSONL file, and
  reading it back.

It uses the process, backends, data and tasks layers; it runs every task alike and never asks which
backend it runs. Nothing here imports `study` or `workshop`.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "train": "loop",
        "check_config": "placement",
        "parse_train_flags": "flags",
        "launch_command": "launch",
        "run_launch": "launch",
        "evaluate_model_file": "score",
        "scaled_lr": "lr",
        "learning_rate": "lr",
        "read_results": "record",
        "append_record": "record",
        "mean_and_ci95": "record",
        "merge_traces": "trace",
        "accelerator_utilisation": "metrics",
        "AU_FORMULA": "metrics",
        "DEFINITIONS": "metrics",
    },
)
__all__ = __dir__()

"""Training layer: one run on this process's rank, from configuration to results record.

(The package is `harness.training`; `harness.train` is the function that runs one.)

- `loop`: `train(config)`, the one loop every backend runs (it never asks which backend it runs);
- `launch`: `harness launch`, N local ranks of `harness train` under a backend's launcher;
- `checkpoint`, `callbacks`, `lr`, `models`, `timing`, `metrics`, `evaluate`: what the loop needs
  (atomic checkpoints and exact resume, hooks, learning-rate rules, the CNN and ResNets, the timed
  window and step breakdown, the one definition of each efficiency metric, exact evaluation);
- `record`: the results record a run returns and appends to a JSONL file, and reading it back.

It uses the process, backends and data layers; nothing here imports `study` or `workshop`.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "train": "loop", "check_config": "loop",
    "launch_command": "launch", "run_launch": "launch",
    "evaluate_model_file": "evaluate",
    "build_model": "models", "MODELS": "models",
    "scaled_lr": "lr", "learning_rate": "lr",
    "read_results": "record", "append_record": "record", "mean_and_ci95": "record",
})
__all__ = __dir__()

"""Tasks layer: what a run trains (a model factory, its data, its loss and metrics) as one `Task`.

- `task`: the `Task` and what the loop asks of it (`loss_and_count`, `batch_scores`); its data is
  anything harness.data can shard (harness.data.indexed), its batches any structure of tensors
  (harness.data.batches);
- `loading`: a task from `--task SPEC` (a built-in name, `MODULE:FUNCTION` or `FILE.py:FUNCTION`)
  and its arguments, on every rank, with the record's account of where it came from;
- `registry`, `images`, `models`, `transformer`: the built-in tasks by name; the image
  classification task, and the CNN and ResNets it trains; the decoder-only language model on token
  data (harness.data.tokens).

The training layer runs every task the same way (and tries each on one batch before any process
group starts, harness.training.probe); nothing here knows a backend.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Task": "task",
        "BatchContext": "task",
        "LoadedTask": "loading",
        "load_task": "loading",
        "builtin_tasks": "registry",
        "image_task": "images",
        "ImageOptions": "images",
        "transformer_task": "transformer",
        "TransformerOptions": "transformer",
        "WorkshopCNN": "models",
        "build_model": "models",
        "MODELS": "models",
    },
)
__all__ = __dir__()

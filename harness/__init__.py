"""Data-parallel training on HPC systems: one CNN, interchangeable DDP / Horovod / DeepSpeed backends.

Python API (what notebooks, exercises and job templates use):

    from harness import TrainConfig, train
    record = train(TrainConfig(backend="ddp", epochs=1))
"""

__version__ = "0.1.0"

from .config import TrainConfig  # noqa: E402
from .errors import PeerFailure, Preempted, UsageError  # noqa: E402


def train(config: "TrainConfig") -> dict:
    """Train one run on this process's rank and return its results record (see harness.train.train)."""
    from .train import train as run

    return run(config)


__all__ = ["PeerFailure", "Preempted", "TrainConfig", "UsageError", "train", "__version__"]

"""Data-parallel training on HPC systems: one CNN, interchangeable DDP / Horovod / DeepSpeed backends.

Python API (what notebooks, exercises and job templates use; every CLI command has one):

    import harness
    record = harness.train(harness.TrainConfig(backend="ddp", epochs=1))       # harness train
    result = harness.run_sweep(harness.SweepSettings(...))                      # harness sweep
    print(harness.scaling_report(result.records))                              # harness report
    figures = harness.scaling_figures(result.records)                          # harness plot
    harness.evaluate_model_file(harness.TrainConfig(...), "model.pt")          # harness evaluate
    harness.check_script("exercises/02_ddp.py")                                # harness check

`train` runs on the rank of whatever launcher started the process, and can be called again and
again in one process (see harness.training.loop). The names here are functions and classes that stay what
they are: no submodule shares a name with them.
"""

from .version import __version__  # noqa: E402

from .training.callbacks import Callback, EpochEnd, StepEnd  # noqa: E402
from .config import TrainConfig  # noqa: E402
from .errors import PeerFailure, Preempted, UsageError  # noqa: E402


def train(config: TrainConfig, callbacks=()) -> dict:
    """Train one run on this process's rank and return its results record (see harness.training.loop.train)."""
    from .training.loop import train as run

    return run(config, callbacks=callbacks)


def run_sweep(settings):
    """Run a scaling study; returns a SweepResult with its records (see harness.study.sweep.run_sweep)."""
    from .study.sweep import run_sweep as run

    return run(settings)


def scaling_report(records) -> str:
    """The Markdown table of a scaling study's records (see harness.study.report.scaling_report)."""
    from .study.report import scaling_report as report

    return report(records)


def scaling_figures(records) -> dict:
    """matplotlib Figures of a scaling study's records (see harness.study.plot.scaling_figures)."""
    from .study.plot import scaling_figures as figures

    return figures(records)


def evaluate_model_file(config: TrainConfig, model_file: str) -> dict:
    """Score a saved model over the launching job's ranks (see harness.training.evaluate.evaluate_model_file)."""
    from .training.evaluate import evaluate_model_file as evaluate

    return evaluate(config, model_file)


def check_script(path: str, ranks: int = 2):
    """Run an exercise's script at `ranks` ranks and judge it (see harness.workshop.checker.check_script)."""
    from .workshop.checker import check_script as check

    return check(path, ranks=ranks)


def read_results(paths) -> list:
    """The records of JSONL results files, or of a job directory's results.jsonl (see harness.training.record.read_results)."""
    from .training.record import read_results as read

    return read([paths] if isinstance(paths, str) else paths)


def __getattr__(name: str):
    # SweepSettings and SweepResult live in harness.study.sweep, which imports torch: load it on first use.
    if name in ("SweepSettings", "SweepResult"):
        from .study import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


__all__ = ["Callback", "EpochEnd", "check_script", "PeerFailure", "Preempted", "StepEnd", "SweepResult", "SweepSettings",
           "TrainConfig", "UsageError", "evaluate_model_file", "read_results", "run_sweep", "scaling_figures",
           "scaling_report", "train", "__version__"]

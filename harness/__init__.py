"""Data-parallel training on HPC systems: your model or the kit's, under interchangeable PyTorch DDP,
Horovod, DeepSpeed (ZeRO 0-3) and FSDP2 backends, measured alike.

Python API (what notebooks, exercises and job templates use; every CLI command has one):

    import harness
    record = harness.train(harness.TrainConfig(backend="ddp", epochs=1))       # harness train
    record = harness.train(config, task=make_task)   # your own harness.Task (harness train --task FILE.py:make_task)
    result = harness.run_sweep(harness.SweepSettings(...), task=make_task)     # harness sweep --task FILE.py:make_task
    memory = harness.memory_per_rank(config, world_size=2)   # harness predict's memory per rank
    bench = harness.bench_allreduce(harness.BenchSettings(backend="ddp", ranks=2))   # harness bench allreduce
    harness.check_study("polaris", "submissions/polaris.sc", ["-A", "proj"])    # harness study --check
    status = harness.run_study("polaris")                   # harness study, inside a batch job
    print(harness.scaling_report(result.records))                              # harness report
    rows = harness.scaling_rows(result.records)       # the report's rows, with their intervals
    figures = harness.scaling_figures(result.records)                          # harness plot
    harness.evaluate_model_file(harness.TrainConfig(...), "model.pt")          # harness evaluate
    harness.check_script("exercises/02_ddp.py")                                # harness check
    harness.merge_traces("trace-dir")                  # harness trace merge (after train --profile-trace)
    harness.trace_figure("trace-dir/trace.json")       # every rank's timeline of the merged trace

`train` runs on the rank of whatever launcher started the process, and can be called again and
again in one process (see harness.training.loop). The names here are functions and classes that stay what
they are: no submodule shares a name with them.
"""

from .config import (  # noqa: E402
    BackendSection,
    DataSection,
    MeasurementSection,
    OptimizerSection,
    RunSection,
    TaskSection,
    TrainConfig,
)
from .errors import PeerFailure, Preempted, UsageError  # noqa: E402
from .training.callbacks import Callback, EpochEnd, StepEnd  # noqa: E402
from .version import __version__  # noqa: E402


def train(config: TrainConfig, callbacks=(), task=None) -> dict:
    """Train one run on this process's rank and return its results record (see harness.training.loop.train).

    `task` (a harness.Task, a function returning one, or a spec string) replaces `config.task`."""
    from .training.loop import train as run

    return run(config, callbacks=callbacks, task=task)


def memory_per_rank(config: TrainConfig, world_size: int):
    """One rank's memory, predicted before any run, when `config` trains at `world_size` ranks: a
    MemoryPrediction with its parts, total() and model_state() in bytes, and its assumptions (see
    harness.study.prediction.memory.config_memory; `harness predict` prints it per backend)."""
    from .study.prediction.memory import config_memory

    return config_memory(config, world_size)


def run_sweep(settings, task=None):
    """Run a scaling study; returns a SweepResult with its records (see harness.study.scaling.sweep.run_sweep).

    `task` (a spec string, or a function returning a harness.Task defined in a file) is every run's --task."""
    from .study.scaling.sweep import run_sweep as run

    return run(settings, task=task)


def run_study(site: str, kit_dir=None, script=None) -> int:
    """This batch job's part of a scaling study at `site`; its exit status (see harness.study.jobs.job.run_study)."""
    from .study.jobs.job import run_study as run

    return run(site, kit_dir=kit_dir, script=script)


def check_study(site: str, script: str, scheduler_args=(), environ=None):
    """Judge a qsub/sbatch of a study's job script before it is queued: a CheckResult whose problems
    and warnings are one line each (see harness.study.jobs.preflight.check_study)."""
    from .study.jobs.preflight import check_study as check

    return check(site, script, scheduler_args, environ)[0]


def scaling_report(records) -> str:
    """The Markdown table of a scaling study's records (see harness.study.scaling.report.scaling_report)."""
    from .study.scaling.report import scaling_report as report

    return report(records)


def scaling_rows(records) -> list:
    """The scaling table's rows as objects, one per study x configuration x workers: throughput,
    speedup and efficiency against the configuration's own fewest-worker run and against the common
    baseline, with their 95% intervals, the POP metrics and memory per rank (see
    harness.study.scaling.report.ScalingRow)."""
    from .study.scaling.report import scaling_rows as rows

    return rows(records)


def scaling_figures(records) -> dict:
    """matplotlib Figures of a scaling study's records (see harness.study.scaling.plot.scaling_figures)."""
    from .study.scaling.plot import scaling_figures as figures

    return figures(records)


def bench_allreduce(settings) -> dict:
    """Time a backend's allreduce per message size and fit the ring model (see harness.study.prediction.bench)."""
    from .study.prediction.bench import bench_allreduce as bench

    return bench(settings)


def evaluate_model_file(config: TrainConfig, model_file: str, task=None) -> dict:
    """Score a saved model over the launching job's ranks (see harness.training.score.evaluate_model_file)."""
    from .training.score import evaluate_model_file as evaluate

    return evaluate(config, model_file, task)


def check_script(path: str, ranks: int = 2):
    """Run an exercise's script at `ranks` ranks and judge it (see harness.workshop.checker.check_script)."""
    from .workshop.checker import check_script as check

    return check(path, ranks=ranks)


def merge_traces(directory: str, output=None) -> str:
    """Merge a --profile-trace directory's per-rank traces into one DIR/trace.json, as a profiled run
    does when it ends; the merged file's path (see harness.training.trace)."""
    from .training.trace import merge_traces as merge

    return merge(directory, output)


def trace_summary(path: str) -> dict:
    """Per rank of a merged trace: seconds in forward, backward, optimizer, allreduce, idle (see harness.study.scaling.trace)."""
    from .study.scaling.trace import trace_summary as summary

    return summary(path)


def trace_spans(path: str) -> dict:
    """Per rank of a merged trace: its training thread's forward, backward, gradient sync and optimizer,
    and its allreduces on the communicator's threads, as (kind, start, end) spans in seconds on the
    trace's one clock (see harness.study.scaling.trace.trace_spans)."""
    from .study.scaling.trace import trace_spans as spans

    return spans(path)


def trace_figure(path: str, title: str = ""):
    """A merged trace as a matplotlib Figure: one row per rank's training thread and one for its
    allreduces, on one clock, where overlap and waiting show (see harness.study.scaling.run_plots.trace_figure)."""
    from .study.scaling.run_plots import trace_figure as figure

    return figure(path, title)


def read_results(paths) -> list:
    """The records of JSONL results files, or of a job directory's results.jsonl (see harness.training.record.read_results)."""
    from .training.record import read_results as read

    return read([paths] if isinstance(paths, str) else paths)


def __getattr__(name: str):
    # SweepSettings and SweepResult live in harness.study.scaling.sweep, which imports torch: load it on first use.
    if name in ("SweepSettings", "SweepResult"):
        from .study.scaling import sweep

        return getattr(sweep, name)
    if name == "BenchSettings":
        from .study.prediction import allreduce

        return allreduce.BenchSettings
    if name in ("Task", "BatchContext"):  # harness.tasks imports torch: load it on first use
        from .tasks import task

        return getattr(task, name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


__all__ = [
    "BackendSection",
    "BatchContext",
    "BenchSettings",
    "DataSection",
    "MeasurementSection",
    "OptimizerSection",
    "RunSection",
    "Task",
    "TaskSection",
    "Callback",
    "EpochEnd",
    "check_script",
    "PeerFailure",
    "Preempted",
    "StepEnd",
    "SweepResult",
    "SweepSettings",
    "TrainConfig",
    "UsageError",
    "bench_allreduce",
    "check_study",
    "evaluate_model_file",
    "memory_per_rank",
    "merge_traces",
    "read_results",
    "run_study",
    "run_sweep",
    "scaling_figures",
    "scaling_report",
    "scaling_rows",
    "trace_figure",
    "trace_spans",
    "trace_summary",
    "train",
    "__version__",
]

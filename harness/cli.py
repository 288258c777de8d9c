"""Command line: `harness train | launch | env | demo | evaluate | data | sweep | plot | report | trace | bench |
predict | recommend | check | exercise | doctor | study`.

A thin layer over the Python API.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, Optional

from . import cli_commands
from .config import DATA_DIR, IMAGE_SIZE, OneLineParser, TrainConfig
from .errors import (
    EXIT_OVER_BUDGET,
    EXIT_PEER_FAILURE,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    OverBudget,
    PeerFailure,
    Preempted,
    UsageError,
)
from .training.flags import add_backend_flags, add_train_flags

# How long a finished rank waits in MPI_Finalize for its peers before it gives up (status 1).
MPI_FINALIZE_LIMIT_S = 60.0


def _predict_flags(parser: argparse.ArgumentParser) -> None:
    from .study.prediction.predict_cli import add_predict_flags

    add_predict_flags(parser)


def _recommend_flags(parser: argparse.ArgumentParser) -> None:
    from .study.prediction.recommend import add_recommend_flags

    add_recommend_flags(parser)


def build_parser(train_defaults: Optional[dict[str, Any]] = None) -> argparse.ArgumentParser:
    """The `harness` parser with all subcommands; `train_defaults` replace `harness train`'s defaults."""
    parser = OneLineParser(
        prog="harness",
        description="Data-parallel training harness: your model under DDP, Horovod, DeepSpeed and FSDP.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    train = commands.add_parser("train", help="train under whatever launcher started this process")
    train.add_argument(
        "--config",
        default=None,
        metavar="JSON",
        help="start from the settings in this file (TrainConfig.to_json, or a record's config); "
        "flags given beside it override them",
    )
    train.declare_later(add_train_flags)  # they import every backend (and torch): only when `train` is used
    train.set_defaults(run=cli_commands.train, **(train_defaults or {}))

    launch = commands.add_parser("launch", help="start N local ranks of `harness train` with a real launcher")
    launch.add_argument("-n", type=int, default=2, help="number of processes (default: 2)")
    launch.add_argument("--backend", default="ddp", help="none, ddp, horovod, deepspeed or fsdp (default: ddp)")
    launch.add_argument(
        "--launcher",
        default=None,
        help="python, torchrun, mpirun, horovodrun or deepspeed (default: the backend's own)",
    )
    launch.add_argument("--dry-run", action="store_true", help="print the exact command instead of running it")
    launch.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then `harness train` flags")
    launch.set_defaults(run=cli_commands.launch)

    env = commands.add_parser("env", help="print the rank, sizes and rendezvous address this process was given")
    env.set_defaults(run=cli_commands.env)

    demo = commands.add_parser("demo", help="train the CNN on digits under every backend and compare")
    demo.add_argument("--results", default=None, help="JSONL file for the records (default: runs/demo-<time>.jsonl)")
    demo.add_argument("--epochs", type=int, default=3, help="epochs per run (default: 3)")
    demo.add_argument(
        "--verbose",
        action="store_true",
        help="show every rank's and launcher's output, framework logging included (also: HARNESS_VERBOSE=1)",
    )
    demo.set_defaults(run=cli_commands.demo)

    evaluate = commands.add_parser(
        "evaluate",
        help="score a saved model on the test set, split over the ranks that launched it",
        description="Every rank scores a disjoint block of the test set; sums are reduced, so accuracy and "
        "eval_samples do not depend on the world size. Launch like `harness train`, e.g. `torchrun "
        "--nproc-per-node 4 -m harness evaluate --backend ddp --model-file m.pt`. --task and the task's "
        "arguments must match the training run.",
    )
    evaluate.add_argument("--model-file", required=True, help="state_dict written by `harness train --save-model`")
    add_train_flags(
        evaluate,
        only=(
            "backend",
            "task",
            "task_args",
            "device",
            "threads",
            "timeout",
            "results",
            "tags",
        ),
    )
    evaluate.set_defaults(run=cli_commands.evaluate)

    data = commands.add_parser("data", help="fetch (online) or prepare (once) a dataset read from --data-dir")
    data_commands = data.add_subparsers(dest="data_command", required=True, parser_class=OneLineParser)
    download = data_commands.add_parser(
        "download",
        help="fetch a dataset with torchvision (needs internet access; "
        "run it on a login node, never in a training job)",
    )
    prepare = data_commands.add_parser(
        "prepare",
        help="convert a dataset once to memory-mapped uint8 arrays in "
        "DATA_DIR/prepared/ (training also does this on first use)",
    )
    for command in (download, prepare):
        command.add_argument("name", help="mnist, fashion-mnist, cifar10 or imagefolder")
        command.add_argument("--data-dir", default=DATA_DIR, help="dataset directory (default: %(default)s)")
    prepare.add_argument(
        "--image-size",
        type=int,
        default=IMAGE_SIZE,
        help="imagefolder: side in pixels to resize and centre-crop to (default: %(default)s)",
    )
    prepare.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds to wait for another process preparing the same dataset (default: %(default)s)",
    )
    download.set_defaults(run=cli_commands.data_download)
    prepare.set_defaults(run=cli_commands.data_prepare)

    sweep = commands.add_parser(
        "sweep",
        allow_abbrev=False,
        help="run a scaling study: every backend x rank count, records in one file",
        description="Run `harness train` for every backend x rank count x repeat and append every record to "
        "--results. Any other flag is a `harness train` flag shared by all runs (see `harness train "
        "--help`). Inside a PBS/Slurm allocation (or with --launch-template) runs start through the "
        "site launcher; the template's placeholders are {ranks} {ppn} {nodes} {python} {backend} {args}.",
    )
    sweep.add_argument(
        "--backends", required=True, help="comma-separated, e.g. ddp,horovod,deepspeed,fsdp (none runs at 1 rank only)"
    )
    sweep.add_argument("--ranks", required=True, help="comma-separated rank counts, e.g. 1,2,4")
    sweep.add_argument(
        "--scaling",
        required=True,
        choices=("weak", "strong"),
        help="weak: --batch-size per worker fixed; strong: --global-batch (default --batch-size) fixed",
    )
    sweep.add_argument("--results", required=True, help="JSONL file every run appends its record to")
    sweep.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per configuration, interleaved; 3 or more give a 95%% interval (default: 3)",
    )
    sweep.add_argument(
        "--order-seed", type=int, default=0, help="seed of each round's random run order (tagged; default: 0)"
    )
    sweep.add_argument(
        "--all-cores-baseline",
        action="store_true",
        help="also run each backend at 1 rank with all the node's cores (tagged baseline=all-cores; "
        "shown apart, never a scaling baseline). Every other run gets --threads (a train flag; "
        "default: cores // the most ranks on a node)",
    )
    sweep.add_argument(
        "--launch-template",
        default=None,
        help="site launch command, e.g. 'mpiexec -n {ranks} --ppn {ppn} {python} -m harness train "
        "{args}' (default inside PBS: that one; inside Slurm: srun ...)",
    )
    sweep.add_argument(
        "--ppn", type=int, default=None, help="ranks per node for the launch template (default: GPUs per node, or 1)"
    )
    sweep.add_argument(
        "--launcher", default=None, help="local runs: one launcher for all backends (default: each backend's own)"
    )
    sweep.add_argument("--sweep-id", default=None, help="tag for this sweep's records (default: random)")
    sweep.add_argument(
        "--run-timeout", type=float, default=3600.0, help="seconds before a run is killed (default: 3600)"
    )
    sweep.add_argument("--dry-run", action="store_true", help="print every run's command instead of running it")
    sweep.add_argument(
        "--log-dir",
        default=None,
        help="write each run's output to DIR/NNN-<backend>-<ranks>r-rep<k>.log and every command "
        "that ran to DIR/commands.txt (default: output to this terminal)",
    )
    sweep.add_argument(
        "--checkpoint-root",
        default=None,
        help="each run checkpoints into DIR/<backend>-<ranks>r-rep<k> and resumes from it: with "
        "--sweep-id, rerunning the sweep after a preemption finishes it",
    )
    sweep.set_defaults(run=cli_commands.sweep, accepts_train_flags=True)

    plot = commands.add_parser("plot", help="scaling figures (PNG + SVG) from results files")
    plot.add_argument("results", nargs="+", help="JSONL results file(s), or job directories (their results.jsonl)")
    plot.add_argument("-o", "--output", required=True, help="prefix of the figure files, e.g. figures/weak")
    plot.set_defaults(run=cli_commands.plot)

    check = commands.add_parser(
        "check",
        help="run an exercise's distributed script at 2 ranks under its real launcher and say what is wrong",
        description="Runs FILE (e.g. exercises/02_ddp.py) at --ranks ranks with a fixed seed and a few steps and "
        "compares with what must happen: identical weights on every rank, equal to one process on "
        "the whole batch; every training sample seen once per epoch; every test sample scored once; "
        "only rank 0 writes; each rank draws its own dropout; micro-batches allreduce once per step. "
        "Prints PASS, or one line per failed property naming its TODO.",
    )
    check.add_argument("file", help="the script to check, e.g. exercises/02_ddp.py")
    check.add_argument("--ranks", type=int, default=2, help="ranks to run it on (default: 2)")
    check.add_argument("--timeout", type=float, default=300.0, help="seconds before the run is stopped (default: 300)")
    check.add_argument(
        "--simulate-nodes",
        type=int,
        default=1,
        metavar="N",
        help="run the ranks as if dealt out to N nodes (each rank's local rank and node as there, on "
        "the CPU), so that a GPU picked by the global rank shows (default: 1)",
    )
    check.set_defaults(run=cli_commands.check)

    exercise = commands.add_parser("exercise", help="your own copy of a hands-on step to work on (my-exercises/)")
    exercise_commands = exercise.add_subparsers(dest="exercise_command", required=True, parser_class=OneLineParser)
    start = exercise_commands.add_parser(
        "start", help="copy a step's exercise to my-exercises/NN_name.py, which `make exercises` never touches"
    )
    start.add_argument("step", help="the step: its number or its name, e.g. 02 or 02_ddp")
    start.add_argument("--notebook", action="store_true", help="also write the notebook form (.ipynb)")
    start.add_argument(
        "--force", action="store_true", help="replace a copy that is already there (your work in it is lost)"
    )
    start.add_argument("--directory", default=None, help="where to write the copy (default: my-exercises/ in the kit)")
    start.set_defaults(run=cli_commands.exercise_start)

    trace = commands.add_parser("trace", help="profiler traces: `harness trace merge DIR`")
    trace_commands = trace.add_subparsers(dest="trace_command", required=True, parser_class=OneLineParser)
    merge = trace_commands.add_parser(
        "merge",
        help="merge the per-rank traces of `harness train --profile-trace DIR` into DIR/trace.json",
        description="One Chrome trace with a process row per rank on one clock, the harness's step phases in "
        "each rank's row; open it in https://ui.perfetto.dev or chrome://tracing.",
    )
    merge.add_argument("directory", help="the --profile-trace directory (holding rank-N.json)")
    merge.add_argument("-o", "--output", default=None, help="write the merged trace here (default: DIR/trace.json)")
    merge.set_defaults(run=cli_commands.trace_merge)

    report = commands.add_parser("report", help="Markdown table of a scaling study: throughput, efficiency, POP")
    report.add_argument("results", nargs="+", help="JSONL results file(s), or job directories (their results.jsonl)")
    report.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="write one self-contained HTML report here (tables, figures, prediction, environment, commands)",
    )
    report.add_argument(
        "--explain",
        action="store_true",
        help="also print what the intervals and every column mean (the definitions of docs/concepts/measurement.md)",
    )
    report.set_defaults(run=cli_commands.report)

    bench = commands.add_parser("bench", help="benchmarks of the communicator: `harness bench allreduce`")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, parser_class=OneLineParser)
    allreduce = bench_commands.add_parser(
        "allreduce",
        help="time any backend's allreduce per message size; fit NCCL's ring alpha-beta model",
        description="With -n, starts N local ranks through the backend's launcher (like `harness launch`); "
        "without, this process is one rank of the job that launched it (mpiexec/srun in an "
        "allocation). Prints time, algbw and busbw per size as nccl-tests does, and the fit of "
        "time = 2(n-1) alpha + 2(n-1)/n bytes / busbw; --results writes it all as JSON.",
    )
    allreduce.add_argument(
        "--backend", default="ddp", help="whose communicator: ddp, horovod, deepspeed, fsdp, none (default: ddp)"
    )
    allreduce.add_argument(
        "--collective",
        default=None,
        help="all_reduce, all_gather or reduce_scatter (sizes are the whole buffer; default: every one of these the "
        "backend issues with its option flags, e.g. --zero-stage 3; several: each to --results FILE-<collective>.json)",
    )
    # The backend's own option flags (as `harness train` takes them, e.g. --zero-stage 3): they decide
    # which collectives it issues, and so which ones are timed where --collective is not given.
    add_backend_flags(allreduce)
    allreduce.add_argument(
        "-n",
        type=int,
        default=None,
        help="start this many local ranks (default: this process is a rank of an existing launch)",
    )
    allreduce.add_argument(
        "--sizes",
        default=None,
        help="message sizes, e.g. 4K,64K,1M,16M,256M (default: 4K to 256M by factors of 4; about 30 s at 2 CPU ranks)",
    )
    allreduce.add_argument(
        "--seconds-per-size",
        type=float,
        default=0.4,
        help="time budget per size; repetitions agreed from a warm-up (default: 0.4)",
    )
    allreduce.add_argument("--min-repeats", type=int, default=3, help="repetitions per size at least (default: 3)")
    allreduce.add_argument("--max-repeats", type=int, default=100, help="repetitions per size at most (default: 100)")
    allreduce.add_argument("--results", default=None, help="write the result as JSON here")
    allreduce.add_argument("--launcher", default=None, help="local ranks: this launcher instead of the backend's own")
    allreduce.add_argument("--device", default="auto", help="auto, cpu, cuda or xpu (default: auto)")
    allreduce.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait (default: 300)")
    # Ranks started by -n run quietly: their parent prints the result once.
    allreduce.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    allreduce.set_defaults(run=cli_commands.bench_allreduce)

    predict = commands.add_parser(
        "predict",
        help="predict step time, throughput and efficiency at 1..512 nodes of a site",
        description="Combines a site's network figures (its profile, or a `harness bench allreduce` fit) with "
        "the compute per step of a run (a record) or of a published throughput, the model's gradient "
        "bytes, the bucket size and the overlap of communication with backward; with --measured, "
        "puts measured step times beside the prediction. See harness/study/prediction/predict.py.",
    )
    predict.declare_later(
        _predict_flags
    )  # declared in harness.study.prediction.predict: loaded only when `predict` is used
    predict.set_defaults(run=cli_commands.predict)

    recommend = commands.add_parser(
        "recommend",
        help="which backends fit a task's memory at each node count of a site, their predicted step, and the choice",
        description="For every backend case (DDP, Horovod, DeepSpeed ZeRO 0-3, FSDP resharding or not; or the "
        "--backend named): the memory a rank holds against the site's device memory (or --memory-cap) and the "
        "step time of `harness predict`'s model with that backend's own traffic; at each node count the fastest "
        "that fits, or those within the prediction's uncertainty of it. See harness/study/prediction/recommend.py.",
    )
    recommend.declare_later(_recommend_flags)  # declared in harness.study.prediction.recommend: loaded only when used
    recommend.set_defaults(run=cli_commands.recommend)

    doctor = commands.add_parser(
        "doctor",
        help="what this node offers a run: modules, Python and backends, MPI, network plugin, GPUs, "
        "scheduler, job directory, site (exit 0 ok, 1 warnings, 2 a problem that stops a job)",
    )
    doctor.add_argument("--site", default=None, help="judge this node as this site's (default: the one identified)")
    doctor.add_argument("--job-dir", default=None, help="where the job's data will go (default: JOB_DIR, the site's)")
    doctor.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    doctor.set_defaults(run=cli_commands.doctor)

    study = commands.add_parser(
        "study",
        help="a whole scaling study in a batch job, checked before it is queued (the job templates run it)",
        description="In a PBS/Slurm job: check, discovery on every rank, the sweep through the site launcher, "
        "figures and report in JOB_DIR, and continuation after the walltime warning or a preemption. "
        "On a login node: --check (or --submit) the qsub/sbatch options given after --. Settings are "
        "NAME=VALUE variables (qsub -v, sbatch's environment); see harness/study/jobs/settings.py.",
    )
    study.add_argument(
        "--site",
        required=True,
        help="polaris, perlmutter, aurora, frontier, generic-slurm, generic-pbs, or a profile JSON",
    )
    study.add_argument("--script", default=None, help="the job script (the templates pass themselves)")
    mode = study.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="judge the submission before it is queued (exit 2: problems)"
    )
    mode.add_argument("--submit", action="store_true", help="check, then qsub/sbatch it")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="the night before: check, then queue the template as a 10-minute debug-queue job (DDP, 20 steps, "
        "every node), wait for it and print its result as the profile's verified_on",
    )
    study.add_argument("scheduler_args", nargs=argparse.REMAINDER, help="-- then qsub/sbatch options")
    study.set_defaults(run=cli_commands.study)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `harness` console script."""
    parser = build_parser()
    # `harness sweep` passes flags it does not know on to `harness train`; all others reject them.
    args, pass_through = parser.parse_known_args(argv)
    if pass_through and not getattr(args, "accepts_train_flags", False):
        parser.error(f"unrecognized arguments: {' '.join(pass_through)}")
    args.pass_through = pass_through
    show_progress()
    try:
        if getattr(args, "config", None):  # settings from a file, with the flags given beside it on top
            args = build_parser(train_defaults=TrainConfig.from_json(args.config).to_dict()).parse_args(argv)
        return args.run(args)
    except UsageError as exc:
        print(f"harness {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Preempted as exc:
        if exc.is_main:
            print(f"harness {args.command}: {exc}", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    except PeerFailure as exc:
        print(f"harness {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_PEER_FAILURE
    except OverBudget as exc:
        print(f"harness {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_OVER_BUDGET


class _CurrentStdoutHandler(logging.StreamHandler):
    """A handler that writes to whatever `sys.stdout` is when a line is logged.

    Jupyter kernels and pytest swap `sys.stdout` per cell or per test; a handler bound to the stream
    of the first call would write into a closed one afterwards ("I/O operation on closed file").
    """

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler assigns it; the current stdout wins
        pass


def show_progress() -> None:
    """Print the harness's own progress lines (logger "harness", INFO) on stdout, as a command does."""
    logger = logging.getLogger("harness")
    if not logger.handlers:
        handler = _CurrentStdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def run_and_exit() -> NoReturn:
    """The `harness` console script: main(), then exit without interpreter finalization.

    By the time main() returns, every result is written. What finalization would still do is run
    library exit hooks and tear down library objects in arbitrary order. After a peer failure the
    hooks (Horovod's, the process group's) would wait on the dead peer. After a finished run, gloo
    worker threads holding Python objects can abort the process (SIGABRT, "terminate called without
    an active exception", seen in CI after a DeepSpeed ZeRO-3 run; pytorch#179291), turning it into a
    failed one. So flush what is buffered, finalize MPI after a finished run, and leave.
    """
    status = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if status == 0:
        try:
            finalize_mpi()
        except Exception as exc:  # an MPI error here must not skip os._exit (and its status)
            print(f"harness: MPI_Finalize failed: {exc}", file=sys.stderr, flush=True)
    os._exit(status)


def finalize_mpi(limit_s: float = MPI_FINALIZE_LIMIT_S) -> None:
    """MPI_Finalize, if mpi4py initialised MPI in this process and nobody finalised it yet.

    MPI is initialised when mpi4py.MPI is imported: by discovery (to broadcast rank 0's hostname
    across nodes), by the horovod backend under mpirun, by a user's script. mpi4py finalises it in
    an exit hook, which os._exit skips, and OpenMPI's mpirun turns a rank that exits 0 without
    MPI_Finalize into "abnormal termination", exit status 1: a finished run reported as failed.
    (Horovod finalises only an MPI it initialised itself, in hvd.shutdown, the backend's shutdown.)
    Called after a finished run only: a rank exiting with 2, 3 or 4 keeps that status through mpirun
    without finalizing, and MPI_Finalize waits for every rank, so after a peer failure it would
    wait on the dead one. In case a peer never gets here, a watchdog that needs no GIL ends the
    process with status 1 after `limit_s`.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    faulthandler.dump_traceback_later(limit_s, exit=True)
    try:
        mpi.Finalize()
    finally:
        faulthandler.cancel_dump_traceback_later()

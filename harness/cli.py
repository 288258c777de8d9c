"""Command line: `harness train | launch | env | demo`. A thin layer over the Python API."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Dict, List, Optional, Sequence

from .config import TrainConfig
from .errors import EXIT_USAGE, UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the fix, with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, named --field-name, typed and documented from the dataclass."""
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        help_text = field.metadata["help"]
        if field.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=help_text)
            continue
        kind = field.metadata.get("type") or (str if field.default is None else type(field.default))
        parser.add_argument(flag, type=kind, default=field.default, metavar=field.name.upper(),
                            help=f"{help_text} (default: {field.default})")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig described by parsed train flags."""
    return TrainConfig(**{field.name: getattr(args, field.name) for field in dataclasses.fields(TrainConfig)})


def _train(args: argparse.Namespace) -> int:
    from .train import train

    train(config_from_args(args))
    return 0


def _launch(args: argparse.Namespace) -> int:
    from .launch import run_launch
    from .backends import get_backend

    train_args = list(args.train_args)
    if train_args and train_args[0] == "--":
        train_args = train_args[1:]
    # Check the flags here, in one process, so bad input fails once and before any rank starts.
    train_parser = OneLineParser(prog="harness train")
    add_train_flags(train_parser)
    config = config_from_args(train_parser.parse_args(["--backend", args.backend, *train_args]))
    config.validate()
    config.local_batch(args.n)
    if not args.dry_run:
        get_backend(args.backend).check_available()
    return run_launch(args.n, args.backend, train_args, args.launcher, args.dry_run)


def _env(args: argparse.Namespace) -> int:
    import dataclasses as dc
    import json

    from .cluster import default_threads, detect_cluster

    cluster = detect_cluster()
    print(json.dumps({**dc.asdict(cluster), "default_threads": default_threads(cluster)}, sort_keys=True), flush=True)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.results, args.epochs)


def build_parser() -> argparse.ArgumentParser:
    """The `harness` parser with all subcommands."""
    parser = OneLineParser(prog="harness", description="Data-parallel training harness: DDP, Horovod, DeepSpeed.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    train = commands.add_parser("train", help="train under whatever launcher started this process")
    add_train_flags(train)
    train.set_defaults(run=_train)

    launch = commands.add_parser("launch", help="start N local ranks of `harness train` with a real launcher")
    launch.add_argument("-n", type=int, default=2, help="number of processes (default: 2)")
    launch.add_argument("--backend", default="ddp", help="none, ddp, horovod or deepspeed (default: ddp)")
    launch.add_argument("--launcher", default=None,
                        help="python, torchrun, mpirun, horovodrun or deepspeed (default: the backend's own)")
    launch.add_argument("--dry-run", action="store_true", help="print the exact command instead of running it")
    launch.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then `harness train` flags")
    launch.set_defaults(run=_launch)

    env = commands.add_parser("env", help="print the rank, sizes and rendezvous address this process was given")
    env.set_defaults(run=_env)

    demo = commands.add_parser("demo", help="train the CNN on digits under every backend and compare")
    demo.add_argument("--results", default=None, help="JSONL file for the records (default: runs/demo-<time>.jsonl)")
    demo.add_argument("--epochs", type=int, default=3, help="epochs per run (default: 3)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `harness` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"harness {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE

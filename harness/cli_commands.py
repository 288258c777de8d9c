"""What each `harness` command runs: the Python API call behind it (harness.cli parses the flags
and hands the namespace here); every one returns the command's exit status."""

from __future__ import annotations

import argparse
import json
import os

from .config import OneLineParser
from .errors import EXIT_PREEMPTED
from .training.flags import add_train_flags, config_from_args


def train(args: argparse.Namespace) -> int:
    from . import train

    train(config_from_args(args))  # with --profile-trace DIR, rank 0 also merges DIR/trace.json
    return 0


def trace_merge(args: argparse.Namespace) -> int:
    from .training.trace import merge_traces

    print(merge_traces(args.directory, args.output), flush=True)
    return 0


def launch(args: argparse.Namespace) -> int:
    from .backends import get_backend
    from .training.launch import run_launch
    from .training.placement import check_config

    train_args = list(args.train_args)
    if train_args and train_args[0] == "--":
        train_args = train_args[1:]
    # Check the flags here, in one process, so bad input fails once and before any rank starts.
    train_parser = OneLineParser(prog="harness train")
    add_train_flags(train_parser)
    config = config_from_args(train_parser.parse_args(["--backend", args.backend, *train_args]))
    check_config(config)
    config.local_batch(args.n)
    if not args.dry_run:
        get_backend(args.backend).check_available()
    return run_launch(args.n, args.backend, train_args, args.launcher, args.dry_run)


def env(args: argparse.Namespace) -> int:
    import dataclasses as dc
    import socket

    from .process.discovery import default_threads, detect_cluster, node_id

    cluster = detect_cluster()
    # The hostname (and the launcher's node index) tell which node each rank landed on: the study job
    # checks the placement against its plan (harness.study.jobs.placement).
    found = {
        **dc.asdict(cluster),
        "default_threads": default_threads(cluster),
        "hostname": socket.gethostname(),
        "node_id": node_id(),
    }
    print(json.dumps(found, sort_keys=True), flush=True)
    return 0


def demo(args: argparse.Namespace) -> int:
    from .workshop.demo import run_demo

    return run_demo(args.results, args.epochs, verbose=args.verbose)


def evaluate(args: argparse.Namespace) -> int:
    from .training.score import evaluate_model_file

    record = evaluate_model_file(config_from_args(args), args.model_file)
    if record["rank"] == 0:
        print(json.dumps(record, sort_keys=True), flush=True)
    return 0


def data_download(args: argparse.Namespace) -> int:
    from .data.download import download

    print(
        f"{args.name} is in {download(args.name, args.data_dir)}; next: `harness data prepare {args.name} "
        f"--data-dir {args.data_dir}`"
    )
    return 0


def data_prepare(args: argparse.Namespace) -> int:
    from .data import prepare_dataset

    directory, prepared_now = prepare_dataset(args.name, args.data_dir, args.image_size, args.timeout)
    print(f"{args.name} {'prepared in' if prepared_now else 'was already prepared in'} {directory}")
    return 0


def sweep(args: argparse.Namespace) -> int:
    from .study.scaling.report import scaling_report
    from .study.scaling.sweep import SweepSettings, parse_list, parse_ranks, run_sweep

    settings = SweepSettings(
        backends=parse_list(args.backends, "backends"),
        ranks=parse_ranks(args.ranks),
        scaling=args.scaling,
        results=args.results,
        train_args=list(args.pass_through),
        repeats=args.repeats,
        order_seed=args.order_seed,
        launch_template=args.launch_template,
        launcher=args.launcher,
        ppn=args.ppn,
        sweep_id=args.sweep_id,
        run_timeout=args.run_timeout,
        dry_run=args.dry_run,
        log_dir=args.log_dir,
        checkpoint_root=args.checkpoint_root,
        all_cores_baseline=args.all_cores_baseline,
    )
    result = run_sweep(settings)
    if settings.dry_run:
        return 0
    print(f"\nsweep {result.sweep_id}: {len(result.records)} record(s) in {settings.results}\n")
    print(scaling_report(result.records), flush=True)
    if result.preempted:
        print(
            f"\nsweep {result.sweep_id} was preempted; run it again with --sweep-id {result.sweep_id} to finish it "
            f"(exit status {EXIT_PREEMPTED})",
            flush=True,
        )
    if result.failed:
        print(f"\nfailed runs: {'; '.join(result.failed)}", flush=True)
    return result.status


def plot(args: argparse.Namespace) -> int:
    from .study.scaling.plot import write_figures
    from .training.record import read_results

    for path in write_figures(read_results(args.results), args.output):
        print(path)
    return 0


def report(args: argparse.Namespace) -> int:
    from .study.scaling.report import scaling_report
    from .study.scaling.report_notes import require_runs
    from .training.record import read_results

    records = read_results(args.results)
    require_runs(records, ", ".join(args.results))
    if args.html:
        from .study.scaling.html_report import write_html_report

        directory = args.results[0] if len(args.results) == 1 and os.path.isdir(args.results[0]) else None
        print(write_html_report(records, args.html, directory))
        return 0
    print(scaling_report(records, explain=args.explain))
    return 0


def bench_allreduce(args: argparse.Namespace) -> int:
    from .study.prediction.allreduce import DEFAULT_SIZES, BenchSettings, format_result, parse_sizes
    from .study.prediction.bench import backend_collectives, bench_collectives, results_path
    from .training.flags import backend_options_given

    settings = BenchSettings(
        backend=args.backend,
        ranks=args.n,
        sizes=parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES,
        seconds_per_size=args.seconds_per_size,
        min_repeats=args.min_repeats,
        max_repeats=args.max_repeats,
        results=args.results,
        launcher=args.launcher,
        device=args.device,
        timeout=args.timeout,
    )
    collectives = (
        [args.collective]
        if args.collective
        else backend_collectives(args.backend, backend_options_given(args, args.backend))
    )
    for kind, result in zip(collectives, bench_collectives(settings, collectives)):
        if result.get("rank", 0) == 0 and not args.quiet:
            written = results_path(args.results, kind, len(collectives) > 1)
            print(format_result(result) + (f"\nwritten to {written}" if written else ""), flush=True)
    return 0


def predict(args: argparse.Namespace) -> int:
    from .study.prediction.predict_cli import predict_command

    return predict_command(args)


def recommend(args: argparse.Namespace) -> int:
    from .study.prediction.recommend import recommend_command

    return recommend_command(args)


def study(args: argparse.Namespace) -> int:
    from .study.jobs.preflight import study_command

    scheduler_args = list(args.scheduler_args)
    if scheduler_args and scheduler_args[0] == "--":
        scheduler_args = scheduler_args[1:]
    mode = "check" if args.check else "submit" if args.submit else "smoke" if args.smoke else "run"
    return study_command(args.site, args.script, mode, scheduler_args)


def check(args: argparse.Namespace) -> int:
    from .workshop.checker import check_command

    return check_command(args.file, ranks=args.ranks, timeout=args.timeout, simulate_nodes=args.simulate_nodes)


def exercise_start(args: argparse.Namespace) -> int:
    from .workshop.my_exercises import start_command

    return start_command(args.step, notebook=args.notebook, force=args.force, directory=args.directory)


def doctor(args: argparse.Namespace) -> int:
    from .study.jobs.doctor import diagnose, this_node

    report = diagnose(this_node(), site=args.site, job_dir=args.job_dir)
    print(json.dumps(report.to_dict(), indent=1) if args.json else "\n".join(report.lines()), flush=True)
    return report.status

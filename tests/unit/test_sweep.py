"""`harness sweep`: the runs it plans and the launch commands it builds (a real sweep end to end is in
tests/integration/test_sweep.py)."""

from __future__ import annotations

import re
import sys

import pytest

from harness.errors import UsageError
from harness.study.scaling.sweep import PBS_TEMPLATE, SweepSettings, plan_sweep
from tests.conftest import REPO
from tests.helpers.backend_cases import DISTRIBUTED

BACKENDS = DISTRIBUTED
# Each framework's speed knobs as a sweep applies them to a model (defaults; Horovod's cycle
# is the harness's CPU default, not Horovod's 1 ms). A backend registered without its entry here
# fails test_every_backend_declares_its_knobs. A backend that records `gradient_allreduce` skips the
# identity allreduce at one rank (Horovod does so itself, and does not record it).
DEFAULT_TUNING = {
    "ddp": {
        "bucket_cap_mb": 25.0,
        "gradient_as_bucket_view": True,
        "find_unused_parameters": False,
        "process_group": "gloo",
    },
    "deepspeed": {
        "zero_stage": 0,
        "process_group": "gloo",
        "throughput_timer": False,
        "zero_reduce_bucket_elements": 500_000_000,
        "zero_allgather_bucket_elements": 500_000_000,
        "zero_sub_group_elements": 1_000_000_000,
        "zero_max_live_elements": 1_000_000_000,
        "zero_max_reuse_elements": 1_000_000_000,
        "zero_prefetch_elements": 50_000_000,
    },
    "horovod": {"fusion_threshold_mb": 128.0, "cycle_time_ms": 5.0, "fp16_compression": False},
    "fsdp": {"reshard_after_forward": True, "fsdp_units": 3, "process_group": "gloo"},
}


def test_every_backend_declares_its_knobs():
    assert set(DEFAULT_TUNING) == set(DISTRIBUTED)


def _settings(tmp_path, **overrides) -> SweepSettings:
    values = dict(
        backends=["none", *BACKENDS],
        ranks=[1, 2],
        scaling="weak",
        results=str(tmp_path / "r.jsonl"),
        repeats=1,
        train_args=["--model", "cnn", "--dataset", "synthetic", "--batch-size", "32"],
        sweep_id="s1",
    )
    values.update(overrides)
    return SweepSettings(**values)


def _train_flags(command) -> list:
    return list(command[list(command).index("train") + 1 :])


def test_weak_sweep_runs_every_combination_with_the_backends_own_launchers(tmp_path):
    runs = plan_sweep(_settings(tmp_path, repeats=2), environ={})
    assert SweepSettings(backends=["ddp"], ranks=[1], scaling="weak", results="r").repeats == 3  # 95% intervals
    # Repeats are interleaved in rounds, each round every configuration once in a seeded random
    # order, recorded in the tags; the single-process baseline runs at one rank only.
    configurations = [
        (ranks, backend) for ranks in (1, 2) for backend in ["none", *BACKENDS] if backend != "none" or ranks == 1
    ]
    assert [r.repeat for r in runs] == [0] * len(configurations) + [1] * len(configurations)
    orders = [[(r.ranks, r.backend) for r in runs if r.repeat == repeat] for repeat in (0, 1)]
    assert all(sorted(order) == sorted(configurations) for order in orders)
    assert orders[0] != orders[1]  # the rounds' orders differ (for this seed)
    assert [next(word for word in r.command if word.startswith("order=")) for r in runs] == [
        f"order={place + 1}/{len(configurations)}" for _ in (0, 1) for place in range(len(configurations))
    ]
    assert "order_seed=0" in runs[0].command
    again = plan_sweep(_settings(tmp_path, repeats=2), environ={})
    assert [(r.repeat, r.ranks, r.backend) for r in again] == [(r.repeat, r.ranks, r.backend) for r in runs]
    other_seed = plan_sweep(_settings(tmp_path, repeats=2, order_seed=1), environ={})
    assert [(r.ranks, r.backend) for r in other_seed] != [(r.ranks, r.backend) for r in runs]
    launchers = {(r.backend, r.ranks): " ".join(r.command[:3]) for r in runs}
    assert launchers["none", 1] == f"{sys.executable} -m harness"
    assert launchers["ddp", 2] == f"{sys.executable} -m torch.distributed.run"
    assert launchers["horovod", 2].split()[0].endswith("horovodrun")
    assert launchers["deepspeed", 2].split()[0].endswith("deepspeed")
    ddp2 = next(r for r in runs if (r.backend, r.ranks, r.repeat) == ("ddp", 2, 1))
    assert ddp2.command[ddp2.command.index("--nproc-per-node") + 1] == "2"
    flags = " ".join(_train_flags(ddp2.command))
    assert "--batch-size 32" in flags and "--global-batch" not in flags
    for tag in ("scaling=weak", "sweep_id=s1", "repeat=1"):
        assert f"--tag {tag}" in flags
    assert f"--results {tmp_path / 'r.jsonl'}" in flags


def test_every_run_of_a_study_gets_the_same_threads_per_rank(tmp_path):
    # 8 cores, at most 4 ranks on a node: 2 threads per rank at 1, 2 and 4 ranks alike.
    settings = _settings(tmp_path, backends=["ddp"], ranks=[1, 2, 4], repeats=1)
    runs = plan_sweep(settings, environ={}, cores=8)
    assert settings.threads == 2
    assert all(_flag(run.command, "--threads") == "2" for run in runs)
    # Under a site launcher the most ranks on a node is --ppn: 16 ranks at 4 per node on 32 cores.
    site = _settings(tmp_path, backends=["ddp"], ranks=[4, 16], ppn=4, repeats=1)
    assert all(
        _flag(run.command, "--threads") == "8" for run in plan_sweep(site, environ={"PBS_NODEFILE": "n"}, cores=32)
    )
    # --threads overrides (as a train flag or in the settings); more ranks than cores still get one.
    given = _settings(tmp_path, backends=["ddp"], ranks=[1, 2], repeats=1, train_args=["--threads", "3"])
    assert all(_flag(run.command, "--threads") == "3" for run in plan_sweep(given, environ={}, cores=2))
    assert given.threads == 3
    crowded = _settings(tmp_path, backends=["ddp"], ranks=[1, 4], repeats=1)
    plan_sweep(crowded, environ={}, cores=2)
    assert crowded.threads == 1
    with pytest.raises(UsageError, match="threads per rank given twice"):
        plan_sweep(_settings(tmp_path, threads=2, train_args=["--threads", "3"]), environ={})


def test_the_all_cores_run_is_a_separate_tagged_configuration(tmp_path):
    runs = plan_sweep(
        _settings(tmp_path, backends=["ddp"], ranks=[1, 2], repeats=2, all_cores_baseline=True), environ={}, cores=2
    )
    assert sorted((r.repeat, r.ranks, r.baseline) for r in runs) == [
        (0, 1, ""),
        (0, 1, "all-cores"),
        (0, 2, ""),
        (1, 1, ""),
        (1, 1, "all-cores"),
        (1, 2, ""),
    ]
    assert [r.repeat for r in runs] == [0, 0, 0, 1, 1, 1]  # interleaved rounds
    all_cores = next(r for r in runs if r.baseline and r.repeat == 0)
    assert all_cores.key == "ddp-1r-all-cores-rep0"
    assert _flag(all_cores.command, "--threads", last=True) == "2" and "baseline=all-cores" in all_cores.command
    scaling = next(r for r in runs if not r.baseline)
    assert _flag(scaling.command, "--threads") == "1" and "baseline=all-cores" not in scaling.command


def _flag(command, name, last=False):
    values = [command[i + 1] for i, word in enumerate(command) if word == name]
    return values[-1] if last else values[0] if len(set(values)) == 1 else values


def test_a_backends_option_flag_reaches_every_run_of_that_backend(tmp_path):
    runs = plan_sweep(_settings(tmp_path, backends=["deepspeed"], train_args=["--zero-stage", "2"]), environ={})
    assert runs and all("--zero-stage 2" in " ".join(_train_flags(run.command)) for run in runs)


def test_strong_sweep_fixes_the_global_batch(tmp_path):
    runs = plan_sweep(_settings(tmp_path, scaling="strong", ranks=[1, 2, 4], backends=["ddp"]), environ={})
    for run in runs:
        flags = _train_flags(run.command)
        assert flags[flags.index("--global-batch") + 1] == "32"  # --batch-size 32 became the global batch
    with pytest.raises(UsageError, match="does not divide by \\[4\\]"):
        plan_sweep(
            _settings(tmp_path, scaling="strong", ranks=[1, 4], backends=["ddp"], train_args=["--global-batch", "6"]),
            environ={},
        )


def test_inside_an_allocation_runs_start_through_the_site_launcher(tmp_path):
    pbs = plan_sweep(_settings(tmp_path, backends=["horovod"], ranks=[1, 8], ppn=4), environ={"PBS_NODEFILE": "n"})
    assert [run.command[:6] for run in pbs] == [
        ("mpiexec", "-n", "1", "--ppn", "1", sys.executable),
        ("mpiexec", "-n", "8", "--ppn", "4", sys.executable),
    ]
    assert _train_flags(pbs[1].command)[:2] == ["--backend", "horovod"]
    slurm = plan_sweep(_settings(tmp_path, backends=["ddp"], ranks=[8], ppn=4), environ={"SLURM_JOB_ID": "7"})
    assert slurm[0].command[:8] == ("srun", "--nodes", "2", "--ntasks", "8", "--ntasks-per-node", "4", sys.executable)
    custom = plan_sweep(
        _settings(
            tmp_path,
            backends=["ddp"],
            ranks=[2],
            launch_template=("aprun -n {ranks} -N {ppn} env B={backend} {python} -m harness train {args}"),
            ppn=2,
        ),
        environ={},
    )
    assert custom[0].command[:6] == ("aprun", "-n", "2", "-N", "2", "env")
    assert "B=ddp" in custom[0].command
    assert PBS_TEMPLATE.startswith("mpiexec -n {ranks} --ppn {ppn}")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(launch_template="srun -n {rank} {args}"), "unknown placeholders \\['rank'\\]"),
        (dict(launch_template="srun -n {ranks} python"), "must contain \\{args\\}"),
        (dict(backends=["dpp"]), "unknown backend 'dpp'; choose one of none, ddp, horovod, deepspeed, fsdp"),
        (dict(backends=["none"], ranks=[2]), "nothing to run"),
        (dict(train_args=["--backend", "ddp"]), "drop --backend"),
        (dict(train_args=["--global-batch", "64"]), "--scaling weak keeps --batch-size per worker fixed"),
        (dict(backends=["ddp", "deepspeed"], train_args=["--zero-stage", "2"]), "--zero-stage is a deepspeed option"),
        (dict(backends=["deepspeed"], train_args=["--zero-stage", "5"]), "--zero-stage must be 0, 1, 2 or 3"),
        (dict(backends=[]), "a sweep needs at least one backend"),
    ],
)
def test_bad_sweeps_fail_before_anything_runs(tmp_path, overrides, message):
    with pytest.raises(UsageError, match=message):
        plan_sweep(_settings(tmp_path, **overrides), environ={})
    assert not (tmp_path / "r.jsonl").exists()


def test_tags_are_key_value_pairs_collected_into_the_config():
    from harness.cli import build_parser
    from harness.training.flags import config_from_args

    args = build_parser().parse_args(["train", "--tag", "nodes=4", "--tag", "note=a=b", "--tag", "nodes=8"])
    assert config_from_args(args).tags == {"nodes": "8", "note": "a=b"}
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["train", "--tag", "nodes"])
    assert exited.value.code == 2


def test_sweep_accepts_checkpoint_every_with_a_checkpoint_root(tmp_path):
    # Every run of such a sweep gets a checkpoint directory, so --checkpoint-every is valid for it.
    runs = plan_sweep(
        SweepSettings(
            backends=["ddp"],
            ranks=[2],
            scaling="weak",
            results=str(tmp_path / "r.jsonl"),
            train_args=["--checkpoint-every", "5"],
            checkpoint_root=str(tmp_path / "ck"),
        ),
        environ={},
    )
    flags = runs[0].command
    assert flags[flags.index("--checkpoint-dir") + 1] == str(tmp_path / "ck" / "ddp-2r-rep0")


def test_the_task_reaches_every_run_by_name_and_loads_once_here(tmp_path, monkeypatch, capsys):
    import harness
    from harness.study.scaling.task_spec import sweep_spec
    from harness.tasks.loading import import_factory
    from tests.helpers import tasks

    monkeypatch.chdir(REPO)  # a task file's relative path is read from here, and made absolute for the runs
    relative = _settings(
        tmp_path,
        backends=["ddp"],
        ranks=[2],
        dry_run=True,
        train_args=["--task", "tests/helpers/tasks.py:regression", "--task-arg", "width=16"],
    )
    harness.run_sweep(relative)
    (command,) = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert _flag(command, "--task") == f"{REPO}/tests/helpers/tasks.py:regression"
    assert _flag(command, "--task-arg") == "width=16"
    # A function: by its module's name where it lives in a package, else by its file's absolute path.
    harness.run_sweep(_settings(tmp_path, backends=["ddp"], ranks=[2], dry_run=True, train_args=[]), task=tasks.tokens)
    (command,) = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert _flag(command, "--task") == "tests.helpers.tasks:tokens"
    from_file, _ = import_factory(f"{REPO}/tests/helpers/tasks.py:auxiliary")
    assert sweep_spec(from_file) == f"{REPO}/tests/helpers/tasks.py:auxiliary"
    assert sweep_spec("images") == "images"


def _nested():
    def make():
        return None

    return make


def _in_a_notebook():
    return None


_in_a_notebook.__module__ = "__main__"  # what a function defined in a notebook cell says of itself


@pytest.mark.parametrize(
    "task, train_args, message",
    [
        ("object", [], "task=a Task object: a sweep starts new processes"),
        (lambda: None, [], "task=<lambda> (defined in tests.unit.test_sweep): a sweep starts new processes"),
        (_nested(), [], "task=_nested.<locals>.make"),
        (_in_a_notebook, [], "task=_in_a_notebook (defined in __main__): a sweep starts new processes"),
        ("images", ["--task", "images"], "the task is given twice"),
        (None, ["--task", "tests/helpers/tasks.py:nothing"], "tests/helpers/tasks.py has no function 'nothing'"),
        (None, ["--task", "tests/helpers/tasks.py:regression", "--task-arg", "depth=2"], "takes arguments width,"),
    ],
)
def test_a_task_the_runs_cannot_reach_fails_in_one_line_before_any_run(tmp_path, task, train_args, message):
    import harness
    from tests.helpers import tasks

    settings = _settings(tmp_path, backends=["ddp"], ranks=[1], train_args=train_args)
    with pytest.raises(UsageError, match=re.escape(message)) as refused:
        harness.run_sweep(settings, task=tasks.regression() if task == "object" else task)
    assert "\n" not in str(refused.value)
    if task is not None and not isinstance(task, str):
        assert str(refused.value).endswith("give task='FILE.py:FUNCTION' (or that function)")
    assert not (tmp_path / "r.jsonl").exists()


def test_records_of_different_tasks_never_pool_into_one_row():
    from harness.study.scaling.report import scaling_report, scaling_rows
    from tests.helpers.handmade_records import record

    def run(throughput, spec, args, sha):
        made = record("ddp", 1, throughput, model="mlp", dataset="points")
        made["task"] = {"spec": spec, "args": args, "source": spec.split(":")[0], "sha256": sha, "builtin": False}
        return made

    mine, other = "/home/me/model.py:make_task", "/home/me/other.py:make_task"
    records = [
        run(100.0, mine, {"width": 64}, "a" * 64),
        run(110.0, mine, {"width": 64}, "b" * 64),  # the file changed between runs: the same task, two digests
        run(300.0, mine, {"width": 8}, "a" * 64),
        run(500.0, other, {"width": 64}, "c" * 64),
        record("ddp", 1, 900.0, model="mlp", dataset="points"),  # a record made before tasks
    ]
    rows = scaling_rows(records)
    assert sorted((row.runs, row.throughput) for row in rows) == [(1, 300.0), (1, 500.0), (1, 900.0), (2, 105.0)]
    assert len({row.study.slug() for row in rows}) == 4
    report = scaling_report(records)
    assert "Weak scaling: mlp on points (model.py:make_task width=64), 64 samples per worker (cpu)" in report
    assert "- task /home/me/model.py:make_task width=64 (/home/me/model.py, sha256 aaaaaaaaaaaa)" in report
    assert "- task /home/me/model.py:make_task width=64 (/home/me/model.py, sha256 bbbbbbbbbbbb)" in report

"""The hands-on steps: solutions that run under their real launchers, learn, and train the weights of
one process on the doubled batch; exercises generated from them; `harness check`, which must pass
every solution and name the TODO behind each mistake of scripts broken on purpose (made here from
the solutions, so they follow every change), and end a hung script within its timeout.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import nbformat
import pytest
import torch

from harness import UsageError, workshop
from harness.process.launchers import free_port, launcher_command
from harness.study.equivalence import UPDATE_BOUND, update_differences, worst
from harness.training.models import WorkshopCNN
from harness.workshop.checker import CheckResult, check_script
from harness.workshop.checker.batch import resolve as resolve_batch
from harness.workshop.checker.devices import DeviceExpressions, simulate_nodes
from harness.workshop.checker.metrics import check_metrics
from harness.workshop.checker.observe import Observation

from .conftest import REPO, harness, run

SOLUTIONS = Path(REPO, "solutions")
EXERCISES = Path(REPO, "exercises")
LAUNCHERS = {
    "01_serial.py": "python",
    "02_ddp.py": "torchrun",
    "03_horovod.py": "horovodrun",
    "04_deepspeed.py": "deepspeed",
    "05_warmup.py": "torchrun",
    "06_fsdp.py": "torchrun",
}
DISTRIBUTED = ["02_ddp.py", "03_horovod.py", "04_deepspeed.py", "05_warmup.py", "06_fsdp.py"]
CHECK_TIMEOUT_S = 240
LEARNED_ACCURACY = 0.90
# The fewest epochs that clear LEARNED_ACCURACY with a margin (94.6%, 93.6%, 90.9%, 96.0% then 93.6%): the
# global batch of 2 ranks takes half the steps of one process, and warmup spends its first epoch
# ramping up.
EPOCHS_TO_LEARN = {
    "01_serial.py": 1,
    "02_ddp.py": 2,
    "03_horovod.py": 2,
    "04_deepspeed.py": 2,
    "05_warmup.py": 3,
    "06_fsdp.py": 2,
}
# horovodrun tags each line with its rank: "[0]<stdout>:epoch 1: ..."
EPOCH_LINE = re.compile(r"^(?:\[(\d+)\]<stdout>:)?epoch (\d+): .* accuracy ([\d.]+)% \((\d+) images\)$", re.M)


@pytest.fixture(autouse=True)
def _check_runs_in_the_tests_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # check_script keeps a failed run's folder when its line points at the run's output.log (the
    # attendee reads it there); the tests' own are made under tmp_path, which pytest removes.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def todo_reference(solution: str, key: str) -> str:
    """ "TODO N of FILE" of the exercised block `key`, as harness check names it."""
    block = next(
        block
        for block in workshop.todo_blocks((SOLUTIONS / solution).read_text(), solution)
        if block.key == key and block.number is not None
    )
    return f"TODO {block.number} of {solution}"


def verdicts(result: CheckResult) -> dict[str, str]:
    """property -> its FAIL line, for each FAIL line."""
    found = {}
    for line in result.lines:
        match = re.match(r"^FAIL ([a-z0-9 ]+): ", line)
        assert match, f"not a FAIL line: {line}"
        found[match[1]] = line
    return found


def broken_variant(directory: Path, solution: str, name: str, replacements: Sequence[tuple[str, str]]) -> Path:
    """`solution` with each `old` (which must occur exactly once) replaced by `new`, written as `name`."""
    text = (SOLUTIONS / solution).read_text()
    for old, new in replacements:
        assert text.count(old) == 1, f"{solution} no longer holds exactly one {old!r}: update this variant"
        text = text.replace(old, new)
    path = directory / name
    path.write_text(text)
    return path


# --- exercises are generated from the solutions ----------------------------------------------


def _make_exercises(*args: str, capsys) -> tuple[int, str]:
    """tools/make_exercises.py ARGS in this process: (exit status, what it printed)."""
    spec = importlib.util.spec_from_file_location("make_exercises", Path(REPO, "tools", "make_exercises.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    status = module.main(list(args))
    return status, capsys.readouterr().out


def test_exercises_are_what_the_solutions_generate(capsys):
    status, printed = _make_exercises("--check", capsys=capsys)
    assert status == 0, printed


def test_the_drift_check_notices_a_changed_solution(tmp_path, capsys):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    for path in SOLUTIONS.glob("*.py"):
        (solutions / path.name).write_text(path.read_text())
    changed = (SOLUTIONS / "03_horovod.py").read_text().replace("batch_size=256", "batch_size=128")
    (solutions / "03_horovod.py").write_text(changed)
    status, printed = _make_exercises("--check", "--solutions", str(solutions), capsys=capsys)
    assert status == 1
    assert "03_horovod.ipynb, 03_horovod.py" in printed and "make exercises" in printed


def test_an_exercise_leaves_out_the_code_of_each_block_and_keeps_its_hint():
    solution = (
        "x = 1\n"
        "# TODO(first): do the first thing\n# hint: like this\ny = 2\n# END TODO\n"
        "    # TODO(second): do the second thing\n    z = 3\n    # END TODO\n"
    )
    assert workshop.exercise_text(solution) == (
        'x = 1\n# TODO 1: do the first thing\n# hint: like this\nworkshop.todo(1, "do the first thing")\n'
        '    # TODO 2: do the second thing\n    workshop.todo(2, "do the second thing")\n'
    )
    only_second = "# exercise: only TODO(second)\n" + solution
    assert workshop.exercise_text(only_second) == (
        "x = 1\n# Do the first thing\n# hint: like this\ny = 2\n"
        '    # TODO 1: do the second thing\n    workshop.todo(1, "do the second thing")\n'
    )


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("# TODO(a): one\nx = 1\n", "has no END TODO"),
        ("x = 1\n# END TODO\n", "without a TODO(key)"),
        ("# TODO(a): one\n# TODO(b): two\n# END TODO\n", "opened inside"),
        ("# TODO(a): one\n# END TODO\n# TODO(a): again\n# END TODO\n", "used twice"),
        ("# exercise: only TODO(b)\n# TODO(a): one\n# END TODO\n", "has no block"),
    ],
)
def test_a_malformed_todo_block_is_refused(text, complaint):
    with pytest.raises(ValueError, match=re.escape(complaint)):
        workshop.todo_blocks(text)


def test_every_distributed_solution_marks_its_distributed_code():
    for name in DISTRIBUTED:
        blocks = workshop.todo_blocks((SOLUTIONS / name).read_text(), name)
        assert [block.number for block in blocks if block.number is not None] == list(
            range(1, 1 + sum(block.number is not None for block in blocks))
        )
        assert any(block.number for block in blocks), name


def test_an_unfinished_exercise_stops_at_todo_1_with_one_line():
    # As an attendee first runs it: plain python, one rank; it stops before its process group.
    result = run(
        [sys.executable, str(EXERCISES / "02_ddp.py")],
        timeout=120,
        cwd=str(REPO),
        env={"MASTER_PORT": str(free_port())},
    )
    first = next(block for block in workshop.todo_blocks((SOLUTIONS / "02_ddp.py").read_text()) if block.number == 1)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"TODO 1 of 02_ddp.py is not done yet: {first.title}"
    assert "Traceback" not in result.stderr


# --- attendees' copies (my-exercises/) ---------------------------------------------------------


def test_make_exercises_rewrites_only_what_it_generates(tmp_path, capsys):
    exercises, mine = tmp_path / "exercises", tmp_path / "my-exercises"
    shutil.copytree(EXERCISES, exercises)
    mine.mkdir()
    (mine / "02_ddp.py").write_text("my work\n")
    (exercises / "notes.md").write_text("an attendee's notes\n")
    (exercises / "09_gone.py").write_text("a step whose solution was removed\n")
    (exercises / "02_ddp.py").write_text("edited in place\n")
    status, printed = _make_exercises("--exercises", str(exercises), capsys=capsys)
    assert status == 0, printed
    assert not (exercises / "09_gone.py").exists()  # generated once, its solution gone
    assert (exercises / "notes.md").read_text() == "an attendee's notes\n"  # not named like a step: not ours
    assert (exercises / "02_ddp.py").read_text() == (EXERCISES / "02_ddp.py").read_text()
    assert (mine / "02_ddp.py").read_text() == "my work\n"
    status, _ = _make_exercises("--exercises", str(mine), capsys=capsys)
    assert status == 2 and (mine / "02_ddp.py").read_text() == "my work\n"


def test_an_exercise_copy_keeps_the_attendees_work(tmp_path):
    mine = tmp_path / "my-exercises"
    [script] = workshop.start_exercise("02", directory=mine)
    assert script == mine / "02_ddp.py"
    expected = (EXERCISES / "02_ddp.py").read_text().replace("exercises/02_ddp.py", f"{mine}/02_ddp.py")
    assert script.read_text() == expected  # the exercise, its commands aimed at the copy
    script.write_text("my work\n")
    with pytest.raises(UsageError, match="already there .* pass --force"):
        workshop.start_exercise("02_ddp", directory=mine, notebook=True)
    assert script.read_text() == "my work\n" and not (mine / "02_ddp.ipynb").exists()
    written = workshop.start_exercise("ddp", directory=mine, notebook=True, force=True)
    assert written == [script, mine / "02_ddp.ipynb"] and script.read_text() == expected
    assert nbformat.validate(nbformat.read(str(mine / "02_ddp.ipynb"), as_version=4)) is None


def test_exercise_start_refuses_in_one_line(tmp_path):
    result = harness("exercise", "start", "7", "--directory", str(tmp_path), timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "harness exercise: error: unknown exercise step '7'; choose one of "
        f"{', '.join(path.stem for path in sorted(EXERCISES.glob('*.py')))}\n"
    )
    assert harness("exercise", "start", "3", "--directory", str(tmp_path), timeout=120).returncode == 0
    again = harness("exercise", "start", "03_horovod", "--directory", str(tmp_path), timeout=120)
    assert again.returncode == 2 and len(again.stderr.splitlines()) == 1 and "--force" in again.stderr


# --- harness check: bad input ------------------------------------------------------------------


def test_check_refuses_a_missing_file_in_one_line():
    result = harness("check", "no/such/script.py", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "harness check: error: no/such/script.py does not exist; give the path of your script, "
        "e.g. exercises/02_ddp.py\n"
    )


@pytest.mark.parametrize(
    "path, complaint",
    [
        ("solutions/01_serial.py", "imports none of deepspeed, horovod"),
        ("README.md", "neither a Python script (.py) nor a notebook"),
    ],
)
def test_check_refuses_what_it_cannot_run(path, complaint):
    with pytest.raises(UsageError, match=re.escape(complaint)):
        check_script(str(Path(REPO, path)))


# --- the solutions -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serial_weights(tmp_path_factory) -> dict[str, torch.Tensor]:
    """01_serial.py on the check's data with the 2-rank global batch: 2 x 16 at LR 0.05 / 2 each."""
    directory = tmp_path_factory.mktemp("serial")
    result = run(
        [
            sys.executable,
            str(SOLUTIONS / "01_serial.py"),
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--lr",
            "0.05",
            "--seed",
            "0",
            "--dropout",
            "0",
            "--train-samples",
            "170",
        ],
        cwd=str(directory),
    )
    assert result.returncode == 0, result.stderr
    return torch.load(directory / "model.pt", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", DISTRIBUTED)
def test_each_solution_passes_the_check_and_trains_the_serial_weights(name, serial_weights):
    result = check_script(str(SOLUTIONS / name), timeout=CHECK_TIMEOUT_S)
    assert result.passed, "\n".join(result.lines)
    assert result.lines[0].startswith("PASS: 2 ranks x 10 steps")
    if name != "05_warmup.py":  # warmup trains at other LRs than the serial step
        torch.manual_seed(0)
        initial = WorkshopCNN(dropout=0.0).state_dict()
        tensor, difference = worst(update_differences(result.weights, serial_weights, initial))
        print(f"{name}: {difference:.3g} of the update from 01_serial.py's (in {tensor})")  # pytest -rP shows it
        assert difference <= UPDATE_BOUND, f"{name}: {tensor} is {difference:.3g} of the update from 01_serial.py's"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_each_solution_learns_under_its_real_launcher(name, tmp_path):
    ranks = 1 if LAUNCHERS[name] == "python" else 2
    epochs = EPOCHS_TO_LEARN[name]
    command = launcher_command(LAUNCHERS[name], ranks, [str(SOLUTIONS / name), "--epochs", str(epochs)])
    result = run(command, cwd=str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    lines = EPOCH_LINE.findall(result.stdout)
    print(result.stdout)  # pytest -rP shows it
    assert [int(epoch) for _, epoch, _, _ in lines] == list(range(1, epochs + 1)), result.stdout  # by one rank only
    assert all(rank in ("", "0") and images == "297" for rank, _, _, images in lines)  # rank 0; each test image once
    assert float(lines[-1][2]) / 100 > LEARNED_ACCURACY, result.stdout
    assert (tmp_path / "model.pt").is_file()


# --- harness check's observations, judged without launching ----------------------------------


@pytest.mark.parametrize(
    "launched, rewritten",
    [
        (
            {
                "RANK": "1",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": "0",
                "GROUP_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
            },
            {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"},
        ),
        (
            {
                "HOROVOD_RANK": "1",
                "HOROVOD_SIZE": "2",
                "HOROVOD_LOCAL_RANK": "1",
                "HOROVOD_LOCAL_SIZE": "2",
                "HOROVOD_CROSS_RANK": "0",
                "HOROVOD_CROSS_SIZE": "1",
                "HOROVOD_HOSTNAME": "localhost",
            },
            {
                "HOROVOD_LOCAL_RANK": "0",
                "HOROVOD_LOCAL_SIZE": "1",
                "HOROVOD_CROSS_RANK": "1",
                "HOROVOD_CROSS_SIZE": "2",
                "HOROVOD_HOSTNAME": "localhost-node1",
                "MASTER_ADDR": "127.0.0.1",
            },
        ),
    ],
    ids=["torchrun", "horovodrun"],
)
def test_simulated_nodes_rewrite_the_launchers_per_node_variables(launched, rewritten):
    environ = dict(launched)  # rank 1 of 2 on one node, as its launcher started it
    place = simulate_nodes(2, environ)
    assert (place.rank, place.world_size, place.local_rank, place.local_world_size) == (1, 2, 0, 1)
    assert environ == {**launched, **rewritten, "CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_the_checker_sees_which_gpu_a_script_would_pick_on_a_cpu(name, tmp_path):
    second_node = {"rank": 1, "local_rank": 0, "device": torch.device("cpu")}  # rank 1, alone on node 2
    picked = DeviceExpressions(str(SOLUTIONS / name)).evaluate(dict(second_node))
    assert picked and {index for index, _ in picked} == {0}, picked
    broken = DeviceExpressions(str(broken_variant(tmp_path, name, name, [GPU_BY_GLOBAL_RANK]))).evaluate(second_node)
    assert any(index == 1 and 'torch.device("cuda", rank)' in where for index, where in broken), broken


@pytest.mark.parametrize(
    "settings",
    [
        {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16},
        {"train_micro_batch_size_per_gpu": 16},
        {"train_batch_size": 16},
        {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16},
        {"train_batch_size": 64, "gradient_accumulation_steps": 2},
        {"gradient_accumulation_steps": 2},
    ],
)
def test_the_checker_completes_deepspeeds_batch_settings_as_deepspeed_does(settings, monkeypatch):
    config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(config.dist, "get_rank", lambda *args, **kwargs: 0)  # as rank 0 of 2
    monkeypatch.setattr(config.dist, "get_world_size", lambda *args, **kwargs: 2)
    try:
        made = config.DeepSpeedConfig(dict(settings))
        completed = (made.train_batch_size, made.train_micro_batch_size_per_gpu, made.gradient_accumulation_steps)
    except AssertionError:
        completed = None  # DeepSpeed refuses them
    assert resolve_batch(settings, 2) == completed


@pytest.mark.parametrize(
    "printed, complaint",
    [
        ("epoch 1: train loss 0.5500 | test loss 0.2498, accuracy 90.9% (297 images)\n", None),
        (
            "epoch 1: train loss 0.5000 | test loss 0.2000, accuracy 94.0% (149 images)\n",
            "rank 0 printed its own training loss of epoch 1 (0.5000), not that of all ranks (0.5500)",
        ),
        ("1 tensor([40., 80.]) tensor([ 29.8000, 140.0000, 149.0000])\n", "rank 0 printed its own training samples"),
        ("epoch 1 done\n", "rank 0 printed no epoch line"),
    ],
)
def test_what_rank_0_prints_is_compared_with_the_values_of_all_ranks(printed, complaint):
    # One epoch of 2 ranks, 80 samples each, 149 and 148 test images; rank 0 printed `printed`.
    failures = check_metrics(
        [
            Observation(
                rank, 2, rank, {}, 1, [], [], None, None, [], [evaluation], {1: train}, printed * (rank == 0), [], []
            )
            for rank, (train, evaluation) in enumerate(
                [([40.0, 80], [29.8, 140.0, 149.0]), ([48.0, 80], [44.4, 130.0, 148.0])]
            )
        ]
    )
    assert len(failures) == (1 if complaint else 0), failures
    assert all(failure.observed.startswith(complaint) and failure.keys == ("metrics",) for failure in failures)


# --- harness check on broken scripts -----------------------------------------------------------

# Pieces of broken variants: each replaces text that occurs once in every solution it is used on.
ADAM = (
    "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)",
    "optimizer = torch.optim.Adam(model.parameters(), lr=lr)",
)
GPU_BY_GLOBAL_RANK = ('device = torch.device("cuda", local_rank)', 'device = torch.device("cuda", rank)')
REPORT = "        workshop.report(epoch, train_sums, test_sums)\n"
PRINTED_UNREDUCED = [
    ("    dist.all_reduce(train_sums)\n    dist.all_reduce(test_sums)\n", ""),  # rank 0's own sums
    (
        REPORT,
        '        print(f"epoch {epoch + 1}: train loss {train_sums[0] / train_sums[1]:.4f}, '
        'accuracy {test_sums[1] / test_sums[2]:.1%}")\n',
    ),
]

# Each FAIL message once, several independent mistakes to a script: one launch judges them all.
# name: (solution, replacements, {property: (TODO key, words the line must hold)})
BROKEN: dict[str, tuple[str, list[tuple[str, str]], dict[str, tuple[str, str]]]] = {
    "ddp-no-wrap-no-sampler-lr-unscaled-whole-test-set-every-rank-saves-and-prints": (
        "02_ddp.py",
        [
            ('model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)\n', ""),
            ("workshop.evaluate(model.module,", "workshop.evaluate(model,"),
            ("if rank == 0:\n    torch.save(model.module.state_dict()", "if True:\n    torch.save(model.state_dict()"),
            ("sampler=sampler, drop_last=True", "shuffle=True, drop_last=True"),
            ("lr = args.lr * world_size", "lr = args.lr"),
            ("test_set = Subset(test_set, range(rank, len(test_set), world_size))\n", ""),
            ("    if rank == 0:\n        workshop.report", "    if True:\n        workshop.report"),
        ],
        {
            "same start": ("wrap", "started training from different weights"),
            "shards": ("shard", "every rank trained on the same samples"),
            "learning rate": ("lr", "used LR 0.025 at step 1"),
            "evaluation": ("eval-shard", "each of the 297 test images 2 times"),
            "rank 0 writes": ("save", "rank 1 wrote model.pt"),
            "metrics": ("metrics", "rank 1 printed an epoch's line too"),
        },
    ),
    "horovod-no-broadcast-no-set-epoch-padded-test-set-test-sums-not-added": (
        "03_horovod.py",
        [
            ("hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", ""),
            ("    sampler.set_epoch(epoch)\n", "    pass\n"),
            (
                "Subset(test_set, range(rank, len(test_set), world_size))",
                "Subset(test_set, list(DistributedSampler(test_set, num_replicas=world_size, rank=rank, shuffle=False)))",
            ),
            ("    test_sums = hvd.allreduce(test_sums, op=hvd.Sum)\n", ""),
        ],
        {
            "same start": ("broadcast", "started training from different weights"),
            "reshuffle": ("reshuffle", "epoch 2 in exactly the order of epoch 1"),
            "evaluation": ("eval-shard", "scored 298 images for 297"),
            "metrics": ("metrics", "over 149 images, not all 297"),
        },
    ),
    "horovod-no-gradient-average-overlapping-shards": (
        "03_horovod.py",
        [
            (
                "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), "
                "op=hvd.Average)\n",
                "",
            ),
            ("rank=rank, seed=args.seed)", "rank=rank, seed=args.seed + rank)"),
        ],
        {
            "same end": ("optimizer", "started alike but ended with different weights"),
            "shards": ("shard", "training samples were trained on more than once"),
        },
    ),
    "horovod-sum-half-the-data": (
        "03_horovod.py",
        [
            ("model.named_parameters(), op=hvd.Average)", "model.named_parameters(), op=hvd.Sum)"),
            ("num_replicas=world_size, rank=rank,", "num_replicas=2 * world_size, rank=rank,"),
        ],
        {
            "one process": ("optimizer", "summed over the ranks, not averaged"),
            "shards": ("shard", "were trained on by no rank"),
        },
    ),
    "deepspeed-default-clipping-nothing-saved": (
        "04_deepspeed.py",
        [
            ('    "gradient_clipping": 0.0,\n', ""),
            ("if rank == 0:\n    torch.save(engine.module.state_dict(), args.save)\n", ""),
        ],
        {
            "one process": ("config", "clips the gradient norm at 1"),
            "rank 0 writes": ("save", "rank 0 did not save the model to --save model.pt"),
        },
    ),
    "ddp-saves-the-wrapped-model": (  # DDP's own state dict: its keys start with `module.`
        "02_ddp.py",
        [("torch.save(model.module.state_dict()", "torch.save(model.state_dict()")],
        {"rank 0 writes": ("save", "has keys the plain model lacks (module.")},
    ),
    "fsdp-saves-its-shards": (  # the sharded model's own state dict: DTensors, each rank's pieces
        "06_fsdp.py",
        [
            (
                "weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))",
                "weights = model.state_dict()",
            )
        ],
        {"rank 0 writes": ("save", "as a DTensor, the ranks' pieces of a sharded weight, not a whole tensor")},
    ),
    "warmup-missing": (
        "05_warmup.py",
        [("progress = min(1.0, step / warmup_steps) if warmup_steps else 1.0", "progress = 1.0")],
        {"learning rate": ("warmup", "the warmup must climb linearly from --lr 0.025")},
    ),
    "warmup-counted-from-1": (  # step 5's text: step 0 trains at --lr
        "05_warmup.py",
        [("min(1.0, step / warmup_steps)", "min(1.0, (step + 1) / warmup_steps)")],
        {"learning rate": ("warmup", "0.05 at step 6 (5 steps later), then stay there: step 1 trains at 0.025")},
    ),
    "ddp-adam-lr-unscaled-gpu-by-global-rank": (  # a GPU by the global rank: at 2 simulated nodes
        "02_ddp.py",
        [ADAM, ("lr = args.lr * world_size", "lr = args.lr"), GPU_BY_GLOBAL_RANK],
        {
            "learning rate": (
                "lr",
                "for Adam the exercise scales it by the square-root rule, --lr x sqrt(2) = 0.03536, or the "
                "linear one, --lr x 2 = 0.05",
            ),
            "device": ("process-group", "rank 1 picks GPU 1, its global rank (line "),
        },
    ),
    "horovod-gpu-by-global-rank-nothing-printed": (
        "03_horovod.py",
        [GPU_BY_GLOBAL_RANK, (REPORT, "        pass\n")],
        {
            "device": ("init", "but it is local rank 0 on its node"),
            "metrics": ("metrics", "rank 0 printed no epoch line"),
        },
    ),
    "deepspeed-global-batch-per-gpu-metrics-printed-unreduced": (
        "04_deepspeed.py",
        [
            ('    "train_micro_batch_size_per_gpu": args.batch_size,\n', ""),
            ("args.batch_size * world_size,", "args.batch_size,"),
            *PRINTED_UNREDUCED,
        ],
        {
            "global batch": ("config", "train_batch_size 16 at 2 ranks: DeepSpeed reads it as a global batch of 16 ("),
            "metrics": ("metrics", "rank 0 printed its own training loss of epoch 1"),
        },
    ),
    "deepspeed-global-batch-per-gpu-refused": (  # DeepSpeed stops in deepspeed.initialize: its TODO, not its assertion
        "04_deepspeed.py",
        [("args.batch_size * world_size,", "args.batch_size,")],
        {"global batch": ("config", "train_micro_batch_size_per_gpu 16 at 2 ranks: DeepSpeed refuses it")},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_check_names_the_todo_behind_each_mistake(variant, tmp_path):
    solution, replacements, expected = BROKEN[variant]
    result = check_script(
        str(broken_variant(tmp_path, solution, f"{variant.replace('-', '_')}.py", replacements)),
        timeout=CHECK_TIMEOUT_S,
        simulate_nodes=2 if "gpu-by-global-rank" in variant else 1,
    )
    print("\n".join(result.lines))  # what an attendee would read (pytest -rP shows it)
    assert result.status == 1
    found = verdicts(result)
    assert sorted(found) == sorted(expected), "\n".join(result.lines)
    for name, (key, words) in expected.items():
        assert words in found[name] and f"-> {todo_reference(solution, key)}: " in found[name], found[name]


@pytest.mark.slow
def test_check_reports_a_framework_error_at_its_line(tmp_path):
    """A ZeRO stage DeepSpeed does not have: DeepSpeed's own complaint, where the script made it."""
    script = broken_variant(
        tmp_path,
        "04_deepspeed.py",
        "zero_stage.py",
        [('    "zero_optimization": {"stage": 0},', '    "zero_optimization": {"stage": 4},')],
    )
    result = check_script(str(script), timeout=CHECK_TIMEOUT_S)
    assert result.status == 1 and len(result.lines) == 1
    assert re.match(
        r"FAIL run: rank \d stopped with ValidationError: .*DeepSpeedZeroConfig.* at line \d+ of "
        r"zero_stage.py \(engine, optimizer, _, _ = deepspeed.initialize\(.* \(output: .*\)$",
        result.lines[0],
    ), result.lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, replacements",
    [
        ("02_ddp.py", [ADAM, ("lr = args.lr * world_size", "lr = args.lr * world_size ** 0.5")]),
        ("02_ddp.py", [ADAM]),
        ("03_horovod.py", []),
    ],
    ids=["ddp-adam-sqrt", "ddp-adam-linear", "horovod"],
)
def test_check_accepts_the_rule_of_adam_and_the_local_rank_on_simulated_nodes(name, replacements, tmp_path):
    """What the exercise asks passes: Adam's LR by the square-root or the linear rule (notebook 02 cannot tell
    them apart), the GPU by the local rank on 2 nodes."""
    result = check_script(
        str(broken_variant(tmp_path, name, name, replacements)), timeout=CHECK_TIMEOUT_S, simulate_nodes=2
    )
    assert result.passed, "\n".join(result.lines)
    assert "no rank picked its GPU by its global rank" in result.lines[0]


@pytest.mark.slow
def test_check_across_two_real_nodes_names_a_gpu_picked_by_the_global_rank(tmp_path):
    """The check's ranks on the 2 nodes of a namespace cluster (tests/multinode), under each node's torchrun as
    the multi-node tests start it: the solution passes; with the GPU picked by the global rank, node 2's fail."""
    from .multinode.jobs import RANKS_PER_NODE, ClusterJob, multinode_commands
    from .multinode.netns_cluster import NamespacesUnavailable, NetnsCluster, check_namespaces

    try:
        check_namespaces()
    except NamespacesUnavailable as exc:
        pytest.skip(f"a check across nodes needs network namespaces: {exc}")
    with NetnsCluster(2, str(tmp_path / "cluster")) as cluster:

        def across_nodes(launcher: str, ranks: int, program: list[str], run_dir, timeout: float):
            commands = [
                (node, argv[: argv.index("harness") - 1] + program)
                for node, argv in multinode_commands(launcher, cluster, [])
            ]
            job = ClusterJob(cluster, commands, cwd=str(run_dir.path))
            statuses = job.wait(timeout)
            run_dir.output_log.write_text(job.output)
            return (None, True) if statuses is None else (max(statuses), False)

        ranks = 2 * RANKS_PER_NODE
        passed = check_script(str(SOLUTIONS / "02_ddp.py"), ranks=ranks, timeout=CHECK_TIMEOUT_S, launch=across_nodes)
        assert passed.passed and "no rank picked its GPU by its global rank" in passed.lines[0], passed.lines
        broken = broken_variant(tmp_path, "02_ddp.py", "global_gpu.py", [GPU_BY_GLOBAL_RANK])
        failed = check_script(str(broken), ranks=ranks, timeout=CHECK_TIMEOUT_S, launch=across_nodes)
        assert [line.split(":")[0] for line in failed.lines] == ["FAIL device"], failed.lines
        assert (
            f"rank {RANKS_PER_NODE} picks GPU {RANKS_PER_NODE}, its global rank" in failed.lines[0]
        )  # node 2's first
        assert todo_reference("02_ddp.py", "process-group") in failed.lines[0]


@pytest.mark.slow
def test_check_reports_an_unfinished_notebook_exercise():
    # Step 5's exercise keeps step 2's code as given: at 2 ranks it runs up to its one TODO, in the loop.
    result = check_script(str(EXERCISES / "05_warmup.ipynb"), timeout=CHECK_TIMEOUT_S)
    first = next(
        block for block in workshop.todo_blocks((SOLUTIONS / "05_warmup.py").read_text()) if block.number == 1
    )
    assert result.status == 1
    assert result.lines == [f"FAIL run: TODO 1 of 05_warmup.py is not done yet: {first.title}"]


@pytest.mark.slow
def test_check_judges_an_attendees_copy_by_its_step(tmp_path):
    # A copy made by `harness exercise start`, outside exercises/: the check still names its step's TODO.
    [script] = workshop.start_exercise("02", directory=tmp_path / "my-exercises")
    result = check_script(str(script), timeout=CHECK_TIMEOUT_S)
    first = next(block for block in workshop.todo_blocks((SOLUTIONS / "02_ddp.py").read_text()) if block.number == 1)
    assert result.status == 1
    assert result.lines == [f"FAIL run: TODO 1 of 02_ddp.py is not done yet: {first.title}"]


@pytest.mark.slow
def test_check_names_a_collective_that_only_one_rank_calls(tmp_path):
    """The classic hang: a collective under `if rank == 0`. The ranks' collectives pair up wrongly and
    the peers wait in vain; the check ends within its timeout and names the collective calls."""
    timeout = 60
    script = broken_variant(
        tmp_path,
        "02_ddp.py",
        "diverges.py",
        [("    dist.all_reduce(train_sums)\n", "    if rank == 0:\n        dist.all_reduce(train_sums)\n")],
    )
    started = time.monotonic()
    result = check_script(str(script), timeout=timeout)
    assert time.monotonic() - started < timeout + 20
    assert result.status == 1 and len(result.lines) == 1, result.lines
    line = result.lines[0]
    assert line.startswith("FAIL run: rank ") and "of diverges.py (dist.all_reduce(" in line, line
    assert "it waited in vain for another rank (rank " in line, line
    assert "every rank must make the same collective calls" in line, line


@pytest.mark.slow
def test_check_ends_a_hung_script_within_its_timeout_and_says_where_it_hung(tmp_path):
    timeout = 20  # the ranks reach the sleep right after their imports
    script = broken_variant(
        tmp_path,
        "02_ddp.py",
        "hangs.py",
        [("torch.manual_seed(args.seed)\n", "torch.manual_seed(args.seed)\nimport time; time.sleep(600)\n")],
    )
    started = time.monotonic()
    result = check_script(str(script), timeout=timeout)
    assert time.monotonic() - started < timeout + 20
    assert result.status == 1 and len(result.lines) == 1
    assert result.lines[0].startswith(f"FAIL run: the run did not finish within {timeout} s: ")
    assert "rank 0 at line" in result.lines[0] and "rank 1 at line" in result.lines[0]
    assert result.lines[0].count("time.sleep(600)") == 2, result.lines[0]
    survivors = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert survivors == [], f"processes of the hung script still run: {survivors}"

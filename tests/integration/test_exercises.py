"""The exercises and their checker run for real: solutions under their launchers, the checker as a
command, scripts that hang or fail."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import workshop
from harness.process.launchers import free_port, launcher_command
from harness.study.scaling.equivalence import UPDATE_BOUND, update_differences, worst
from harness.tasks.models import WorkshopCNN
from harness.training.lr import scaled_lr
from harness.workshop.checker import CheckResult, check_script
from harness.workshop.checker.autocast import TOLERANCE as AUTOCAST_TOLERANCE
from tests.conftest import REPO, harness, run
from tests.helpers.weights import load_weights
from tests.unit.test_exercises import (
    ADAM,
    BROKEN,
    CHECK_TIMEOUT_S,
    DISTRIBUTED,
    EPOCH_LINE,
    EPOCHS_TO_LEARN,
    EXERCISES,
    GPU_BY_GLOBAL_RANK,
    LAUNCHERS,
    LEARNED_ACCURACY,
    SAME_SEED,
    SCALED_LR,
    SOLUTIONS,
    broken_variant,
)

PROCESS_GROUP_JOINED = "rank, world_size = dist.get_rank(), dist.get_world_size()\n"


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


def test_exercise_start_refuses_in_one_line(tmp_path):
    missing = str(len(list(EXERCISES.glob("*.py"))) + 1)  # one past the last step
    result = harness("exercise", "start", missing, "--directory", str(tmp_path), timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"harness exercise: error: unknown exercise step '{missing}'; choose one of "
        f"{', '.join(path.stem for path in sorted(EXERCISES.glob('*.py')))}\n"
    )
    assert harness("exercise", "start", "3", "--directory", str(tmp_path), timeout=120).returncode == 0
    again = harness("exercise", "start", "03_horovod", "--directory", str(tmp_path), timeout=120)
    assert again.returncode == 2 and len(again.stderr.splitlines()) == 1 and "--force" in again.stderr


def test_check_refuses_a_missing_file_in_one_line():
    result = harness("check", "no/such/script.py", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "harness check: error: no/such/script.py does not exist; give the path of your script, "
        "e.g. exercises/02_ddp.py\n"
    )


@pytest.fixture(scope="module")
def serial_weights(tmp_path_factory) -> dict[str, torch.Tensor]:
    """01_serial.py on the check's data with the 2-rank global batch: 2 x 16 at --lr 0.05 / 2 each, scaled by
    notebook 02's rule (the square root of 2 ranks), as the solutions scale it."""
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
            repr(scaled_lr(0.05 / 2, 2, 1, "sqrt")),
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
    return load_weights(directory / "model.pt")


# What the PASS line says of each step's own lesson, beyond what every step passes on.
PASS_SAYS = {
    "03_horovod.py": "the 2 micro-batches of a step averaged their gradients over the ranks once (Horovod's "
    "backward_passes_per_step)",
    "04_deepspeed.py": "once (DeepSpeed's gradient_accumulation_steps)",
    "06_fsdp.py": "once (FSDP2's set_requires_gradient_sync)",
    "07_accumulation.py": "once (DDP's no_sync)",
    "08_resume.py": "; stopped after epoch 1 and resumed for 1 more, it ended with the weights of the run never stopped",
    "09_mixed_precision.py": f", within {AUTOCAST_TOLERANCE:g} of the update in float32 (the forwards ran under "
    "autocast in bfloat16, the weights in float32)",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", DISTRIBUTED)
def test_each_solution_passes_the_check_and_trains_the_serial_weights(name, serial_weights):
    """Every step passes (step 8 straight through, then stopped and resumed: three runs), and trains
    what one process does; in bf16 (step 9) within the check's 16-bit tolerance."""
    result = check_script(str(SOLUTIONS / name), timeout=CHECK_TIMEOUT_S)
    assert result.passed, "\n".join(result.lines)
    assert result.lines[0].startswith("PASS: 2 ranks x 10 steps")
    assert PASS_SAYS.get(name, "PASS") in result.lines[0], result.lines[0]
    if name != "05_warmup.py":  # warmup trains at other LRs than the serial step
        torch.manual_seed(0)
        initial = WorkshopCNN(dropout=0.0).state_dict()
        tensor, difference = worst(update_differences(result.weights, serial_weights, initial))
        print(f"{name}: {difference:.3g} of the update from 01_serial.py's (in {tensor})")  # pytest -rP shows it
        bound = AUTOCAST_TOLERANCE if name == "09_mixed_precision.py" else UPDATE_BOUND
        assert difference <= bound, f"{name}: {tensor} is {difference:.3g} of the update from 01_serial.py's"


# Run for whole epochs as an attendee runs them: the serial step, the first distributed one, and the two
# whose check allows other weights than 01_serial.py's (other LRs; bfloat16). Each other step's check above
# runs it under its real launcher and finds 01_serial.py's weights, which this test sees learn.
LEARNING_RUNS = ("01_serial.py", "02_ddp.py", "05_warmup.py", "09_mixed_precision.py")


@pytest.mark.slow
@pytest.mark.parametrize("name", LEARNING_RUNS)
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
def test_check_names_what_a_resume_loses(tmp_path):
    """Step 8 resumed without the optimizer's state, with the epochs counted from 0 again (the sampler deals
    epoch 1's order) and without the random state: its three runs, one line for each loss."""
    script = broken_variant(
        tmp_path,
        "08_resume.py",
        "loses_state.py",
        [
            ('    optimizer.load_state_dict(checkpoint["optimizer"])\n', ""),
            ("for epoch in range(start_epoch, args.epochs):", "for epoch in range(args.epochs - start_epoch):"),
            ('    torch.set_rng_state(checkpoint["random_states"][rank]["cpu"])\n', ""),
        ],
    )
    result = check_script(str(script), timeout=CHECK_TIMEOUT_S)
    print("\n".join(result.lines))  # what an attendee would read (pytest -rP shows it)
    resume, checkpoint = (f"{todo_reference('08_resume.py', key)}: " for key in ("resume", "checkpoint"))
    expected = [
        ("took its first step with no optimizer state, where the stopped run's optimizer held momentum_buffer", True),
        ("'s first training forward of epoch 2 drew from another random state than in the uninterrupted run", True),
        ("'s resumed run trained epoch 2 on its samples in the order of epoch 1 of the uninterrupted run", False),
    ]
    assert result.status == 1 and len(result.lines) == len(expected), result.lines
    for line, (words, both) in zip(result.lines, expected):
        assert line.startswith("FAIL resume: rank ") and words in line and f"-> {resume}" in line, line
        assert (checkpoint in line) == both, line  # the loss of what the checkpoint must hold names its TODO too


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
        ("02_ddp.py", [ADAM]),
        ("05_warmup.py", [ADAM]),
        ("03_horovod.py", [(SCALED_LR, "lr = args.lr * world_size")]),
        (
            "02_ddp.py",
            [
                SAME_SEED,
                (PROCESS_GROUP_JOINED, PROCESS_GROUP_JOINED + "torch.manual_seed(args.seed + rank)\n"),
                (SCALED_LR, "lr = args.lr"),
            ],
        ),
    ],
    ids=["ddp-adam", "warmup-adam", "horovod-sgd-linear", "ddp-seeded-per-rank-before-the-model-sgd-unscaled"],
)
def test_check_accepts_what_the_exercise_asks_done_otherwise(name, replacements, tmp_path):
    """What the exercise asks passes: Adam's LR by notebook 02's rule, without and with its warmup; SGD's by
    the linear rule or unscaled too, which notebook 02's runs could not reject; the GPU by the local rank on
    2 nodes; ranks seeded apart before the model is built (the broadcast gives them rank 0's weights, their
    dropout draws its own)."""
    result = check_script(
        str(broken_variant(tmp_path, name, name, replacements)), timeout=CHECK_TIMEOUT_S, simulate_nodes=2
    )
    assert result.passed, "\n".join(result.lines)
    assert "no rank picked its GPU by its global rank" in result.lines[0]


@pytest.mark.slow
def test_check_across_two_real_nodes_names_a_gpu_picked_by_the_global_rank(tmp_path):
    """The check's ranks on the 2 nodes of a namespace cluster (tests/multinode), under each node's torchrun as
    the multi-node tests start it: the solution passes; with the GPU picked by the global rank, node 2's fail."""
    from tests.multinode.jobs import RANKS_PER_NODE, ClusterJob, multinode_commands
    from tests.multinode.netns_cluster import NamespacesUnavailable, NetnsCluster, check_namespaces

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

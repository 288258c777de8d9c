"""The hands-on steps: solutions that run under their real launchers, learn, and train the weights of
one process on the doubled batch; exercises generated from them; `harness check`, which must pass
every solution and name the TODO behind each mistake of scripts broken on purpose (made here from
the solutions, so they follow every change), and end a hung script within its timeout.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest
import torch

from harness import UsageError, workshop
from harness.workshop.checker import CheckResult, check_script
from harness.study.equivalence import UPDATE_BOUND, update_differences, worst
from harness.process.launchers import free_port, launcher_command
from harness.training.models import WorkshopCNN

from .conftest import REPO, harness, run

SOLUTIONS = Path(REPO, "solutions")
EXERCISES = Path(REPO, "exercises")
LAUNCHERS = {"01_serial.py": "python", "02_ddp.py": "torchrun", "03_horovod.py": "horovodrun",
             "04_deepspeed.py": "deepspeed", "05_warmup.py": "torchrun"}
DISTRIBUTED = ["02_ddp.py", "03_horovod.py", "04_deepspeed.py", "05_warmup.py"]
CHECK_TIMEOUT_S = 240
LEARNED_ACCURACY = 0.90
# The fewest epochs that clear LEARNED_ACCURACY with a margin (94.6%, 93.6%, 90.9% then 96.0%): the
# global batch of 2 ranks takes half the steps of one process, and warmup spends its first epoch
# ramping up.
EPOCHS_TO_LEARN = {"01_serial.py": 1, "02_ddp.py": 2, "03_horovod.py": 2, "04_deepspeed.py": 2, "05_warmup.py": 3}
# horovodrun tags each line with its rank: "[0]<stdout>:epoch 1: ..."
EPOCH_LINE = re.compile(r"^(?:\[(\d+)\]<stdout>:)?epoch (\d+): .* accuracy ([\d.]+)% \((\d+) images\)$", re.M)


def todo_reference(solution: str, key: str) -> str:
    """"TODO N of FILE" of the exercised block `key`, as harness check names it."""
    block = next(block for block in workshop.todo_blocks((SOLUTIONS / solution).read_text(), solution)
                 if block.key == key and block.number is not None)
    return f"TODO {block.number} of {solution}"


def verdicts(result: CheckResult) -> Dict[str, str]:
    """property -> its FAIL line, for each FAIL line."""
    found = {}
    for line in result.lines:
        match = re.match(r"^FAIL ([a-z0-9 ]+): ", line)
        assert match, f"not a FAIL line: {line}"
        found[match[1]] = line
    return found


def broken_variant(directory: Path, solution: str, name: str, replacements: Sequence[Tuple[str, str]]) -> Path:
    """`solution` with each `old` (which must occur exactly once) replaced by `new`, written as `name`."""
    text = (SOLUTIONS / solution).read_text()
    for old, new in replacements:
        assert text.count(old) == 1, f"{solution} no longer holds exactly one {old!r}: update this variant"
        text = text.replace(old, new)
    path = directory / name
    path.write_text(text)
    return path


# --- exercises are generated from the solutions ----------------------------------------------


def _make_exercises(*args: str, capsys) -> Tuple[int, str]:
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
    solution = ("x = 1\n"
                "# TODO(first): do the first thing\n# hint: like this\ny = 2\n# END TODO\n"
                "    # TODO(second): do the second thing\n    z = 3\n    # END TODO\n")
    assert workshop.exercise_text(solution) == (
        "x = 1\n# TODO 1: do the first thing\n# hint: like this\nworkshop.todo(1, \"do the first thing\")\n"
        "    # TODO 2: do the second thing\n    workshop.todo(2, \"do the second thing\")\n")
    only_second = "# exercise: only TODO(second)\n" + solution
    assert workshop.exercise_text(only_second) == (
        "x = 1\n# Do the first thing\n# hint: like this\ny = 2\n"
        "    # TODO 1: do the second thing\n    workshop.todo(1, \"do the second thing\")\n")


@pytest.mark.parametrize("text, complaint", [
    ("# TODO(a): one\nx = 1\n", "has no END TODO"),
    ("x = 1\n# END TODO\n", "without a TODO(key)"),
    ("# TODO(a): one\n# TODO(b): two\n# END TODO\n", "opened inside"),
    ("# TODO(a): one\n# END TODO\n# TODO(a): again\n# END TODO\n", "used twice"),
    ("# exercise: only TODO(b)\n# TODO(a): one\n# END TODO\n", "has no block"),
])
def test_a_malformed_todo_block_is_refused(text, complaint):
    with pytest.raises(ValueError, match=re.escape(complaint)):
        workshop.todo_blocks(text)


def test_every_distributed_solution_marks_its_distributed_code():
    for name in DISTRIBUTED:
        blocks = workshop.todo_blocks((SOLUTIONS / name).read_text(), name)
        assert [block.number for block in blocks if block.number is not None] == list(
            range(1, 1 + sum(block.number is not None for block in blocks)))
        assert any(block.number for block in blocks), name


def test_an_unfinished_exercise_stops_at_todo_1_with_one_line():
    # As an attendee first runs it: plain python, one rank; it stops before its process group.
    result = run([sys.executable, str(EXERCISES / "02_ddp.py")], timeout=120, cwd=str(REPO),
                 env={"MASTER_PORT": str(free_port())})
    first = next(block for block in workshop.todo_blocks((SOLUTIONS / "02_ddp.py").read_text()) if block.number == 1)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"TODO 1 of 02_ddp.py is not done yet: {first.title}"
    assert "Traceback" not in result.stderr


# --- harness check: bad input ------------------------------------------------------------------


def test_check_refuses_a_missing_file_in_one_line():
    result = harness("check", "no/such/script.py", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("harness check: error: no/such/script.py does not exist; give the path of your script, "
                             "e.g. exercises/02_ddp.py\n")


@pytest.mark.parametrize("path, complaint", [("solutions/01_serial.py", "imports none of deepspeed, horovod"),
                                             ("README.md", "neither a Python script (.py) nor a notebook")])
def test_check_refuses_what_it_cannot_run(path, complaint):
    with pytest.raises(UsageError, match=re.escape(complaint)):
        check_script(str(Path(REPO, path)))


# --- the solutions -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serial_weights(tmp_path_factory) -> Dict[str, torch.Tensor]:
    """01_serial.py on the check's data with the 2-rank global batch: 2 x 16 at LR 0.05 / 2 each."""
    directory = tmp_path_factory.mktemp("serial")
    result = run([sys.executable, str(SOLUTIONS / "01_serial.py"), "--epochs", "2", "--batch-size", "32",
                  "--lr", "0.05", "--seed", "0", "--dropout", "0", "--train-samples", "170"], cwd=str(directory))
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


# --- harness check on broken scripts -----------------------------------------------------------

# Each FAIL message once, several independent mistakes to a script: one launch judges them all.
# name: (solution, replacements, {property: (TODO key, words the line must hold)})
BROKEN: Dict[str, Tuple[str, List[Tuple[str, str]], Dict[str, Tuple[str, str]]]] = {
    "ddp-no-wrap-no-sampler-lr-unscaled-whole-test-set-every-rank-saves-and-prints": (
        "02_ddp.py",
        [('model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)\n', ""),
         ("workshop.evaluate(model.module,", "workshop.evaluate(model,"),
         ("if rank == 0:\n    torch.save(model.module.state_dict()", "if True:\n    torch.save(model.state_dict()"),
         ("sampler=sampler, drop_last=True", "shuffle=True, drop_last=True"),
         ("lr = args.lr * world_size", "lr = args.lr"),
         ("test_set = Subset(test_set, range(rank, len(test_set), world_size))\n", ""),
         ("    if rank == 0:\n        workshop.report", "    if True:\n        workshop.report")],
        {"same start": ("wrap", "started training from different weights"),
         "shards": ("shard", "every rank trained on the same samples"),
         "learning rate": ("lr", "used LR 0.025 at step 1"),
         "evaluation": ("eval-shard", "each of the 297 test images 2 times"),
         "rank 0 writes": ("save", "rank 1 wrote model.pt"),
         "metrics": ("metrics", "rank 1 printed an epoch's line too")}),
    "horovod-no-broadcast-no-set-epoch-padded-test-set-test-sums-not-added": (
        "03_horovod.py",
        [("hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", ""),
         ("    sampler.set_epoch(epoch)\n", "    pass\n"),
         ("Subset(test_set, range(rank, len(test_set), world_size))",
          "Subset(test_set, list(DistributedSampler(test_set, num_replicas=world_size, rank=rank, shuffle=False)))"),
         ("    test_sums = hvd.allreduce(test_sums, op=hvd.Sum)\n", "")],
        {"same start": ("broadcast", "started training from different weights"),
         "reshuffle": ("reshuffle", "epoch 2 in exactly the order of epoch 1"),
         "evaluation": ("eval-shard", "scored 298 images for 297"),
         "metrics": ("metrics", "over 149 images, not all 297")}),
    "horovod-no-gradient-average-overlapping-shards": (
        "03_horovod.py",
        [("optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), "
          "op=hvd.Average)\n", ""),
         ("rank=rank, seed=args.seed)", "rank=rank, seed=args.seed + rank)")],
        {"same end": ("optimizer", "started alike but ended with different weights"),
         "shards": ("shard", "training samples were trained on more than once")}),
    "horovod-sum-half-the-data": (
        "03_horovod.py",
        [("model.named_parameters(), op=hvd.Average)", "model.named_parameters(), op=hvd.Sum)"),
         ("num_replicas=world_size, rank=rank,", "num_replicas=2 * world_size, rank=rank,")],
        {"one process": ("optimizer", "summed over the ranks, not averaged"),
         "shards": ("shard", "were trained on by no rank")}),
    "deepspeed-default-clipping-nothing-saved": (
        "04_deepspeed.py",
        [('    "gradient_clipping": 0.0,\n', ""),
         ("if rank == 0:\n    torch.save(engine.module.state_dict(), args.save)\n", "")],
        {"one process": ("config", "clips the gradient norm at 1"),
         "rank 0 writes": ("save", "rank 0 did not save the model to --save model.pt")}),
    "warmup-missing": (
        "05_warmup.py", [("progress = min(1.0, step / warmup_steps) if warmup_steps else 1.0", "progress = 1.0")],
        {"learning rate": ("warmup", "the warmup must climb linearly from --lr 0.025")}),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_check_names_the_todo_behind_each_mistake(variant, tmp_path):
    solution, replacements, expected = BROKEN[variant]
    result = check_script(str(broken_variant(tmp_path, solution, f"{variant.replace('-', '_')}.py", replacements)),
                          timeout=CHECK_TIMEOUT_S)
    print("\n".join(result.lines))  # what an attendee would read (pytest -rP shows it)
    assert result.status == 1
    found = verdicts(result)
    assert sorted(found) == sorted(expected), "\n".join(result.lines)
    for name, (key, words) in expected.items():
        assert words in found[name] and f"-> {todo_reference(solution, key)}: " in found[name], found[name]


@pytest.mark.slow
def test_check_reports_a_framework_error_at_its_line(tmp_path):
    """DeepSpeed's global batch given per GPU: DeepSpeed's own complaint, where the script made it."""
    script = broken_variant(tmp_path, "04_deepspeed.py", "global_batch.py",
                            [('"train_batch_size": args.batch_size * world_size', '"train_batch_size": args.batch_size')])
    result = check_script(str(script), timeout=CHECK_TIMEOUT_S)
    assert result.status == 1 and len(result.lines) == 1
    assert re.match(r"FAIL run: rank \d stopped with AssertionError: .* at line \d+ of global_batch.py "
                    r"\(engine, optimizer, _, _ = deepspeed.initialize\(", result.lines[0]), result.lines[0]


@pytest.mark.slow
def test_check_reports_an_unfinished_notebook_exercise():
    # Step 5's exercise keeps step 2's code as given: at 2 ranks it runs up to its one TODO, in the loop.
    result = check_script(str(EXERCISES / "05_warmup.ipynb"), timeout=CHECK_TIMEOUT_S)
    first = next(block for block in workshop.todo_blocks((SOLUTIONS / "05_warmup.py").read_text()) if block.number == 1)
    assert result.status == 1
    assert result.lines == [f"FAIL run: TODO 1 of 05_warmup.py is not done yet: {first.title}"]


@pytest.mark.slow
def test_check_ends_a_hung_script_within_its_timeout_and_says_where_it_hung(tmp_path):
    timeout = 20  # the ranks reach the sleep right after their imports
    script = broken_variant(tmp_path, "02_ddp.py", "hangs.py",
                            [("torch.manual_seed(args.seed)\n", "torch.manual_seed(args.seed)\nimport time; time.sleep(600)\n")])
    started = time.monotonic()
    result = check_script(str(script), timeout=timeout)
    assert time.monotonic() - started < timeout + 20
    assert result.status == 1 and len(result.lines) == 1
    assert result.lines[0].startswith(f"FAIL run: the run did not finish within {timeout} s: ")
    assert "rank 0 at line" in result.lines[0] and "rank 1 at line" in result.lines[0]
    assert result.lines[0].count("time.sleep(600)") == 2, result.lines[0]
    survivors = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert survivors == [], f"processes of the hung script still run: {survivors}"

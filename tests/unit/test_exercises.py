"""The hands-on steps in-process: exercises generated from the solutions, the checker's reading of
what a script prints and which GPU it picks, and what it refuses. The solutions under their real
launchers and `harness check` run for real are in tests/integration/test_exercises.py.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import nbformat
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness import UsageError, workshop
from harness.backends import backend_class
from harness.process.launchers import free_port
from harness.workshop.checker import check_script
from harness.workshop.checker.accumulation import check_accumulation
from harness.workshop.checker.batch import resolve as resolve_batch
from harness.workshop.checker.devices import DeviceExpressions, simulate_nodes
from harness.workshop.checker.metrics import check_metrics
from harness.workshop.checker.observe import Observation
from harness.workshop.checker.seeds import check_rank_seeds, random_state
from harness.workshop.checker.todos import FRAMEWORKS
from tests.conftest import REPO

SOLUTIONS = Path(REPO, "solutions")
EXERCISES = Path(REPO, "exercises")
LAUNCHERS = {
    "01_serial.py": "python",
    "02_ddp.py": "torchrun",
    "03_horovod.py": "horovodrun",
    "04_deepspeed.py": "deepspeed",
    "05_warmup.py": "torchrun",
    "06_fsdp.py": "torchrun",
    "07_accumulation.py": "torchrun",
}
DISTRIBUTED = ["02_ddp.py", "03_horovod.py", "04_deepspeed.py", "05_warmup.py", "06_fsdp.py", "07_accumulation.py"]
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
    "07_accumulation.py": 2,
}
# horovodrun tags each line with its rank: "[0]<stdout>:epoch 1: ..."
EPOCH_LINE = re.compile(r"^(?:\[(\d+)\]<stdout>:)?epoch (\d+): .* accuracy ([\d.]+)% \((\d+) images\)$", re.M)


@pytest.fixture(autouse=True)
def _check_runs_in_the_tests_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # check_script keeps a failed run's folder when its line points at the run's output.log (the
    # attendee reads it there); the tests' own are made under tmp_path, which pytest removes.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


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


# --- attendees' copies (my-exercises/) ---------------------------------------------------------


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


# --- harness check: bad input ------------------------------------------------------------------


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


def _observation(rank: int, **fields) -> Observation:
    """Rank `rank` of a finished run of 2 that did nothing but what `fields` say."""
    return Observation(rank, 2, rank, {}, 1, [], [], None, None, [], [], {}, "", [], [], **fields)


def _seeded(seed: int) -> str:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return random_state(torch.device("cpu"))


@pytest.mark.parametrize(
    "seeds, complaint",
    [
        ([0, 0], "every rank started training from the same random state"),
        ([1, 2], None),
        ([1, 2, 1, 3], "ranks 0, 2 started training from the same random state"),  # seeded by the local rank
    ],
)
def test_ranks_that_draw_dropout_from_one_random_state_are_named(seeds, complaint):
    framework = FRAMEWORKS[0]
    observations = [_observation(rank, random_state=_seeded(seed)) for rank, seed in enumerate(seeds)]
    failures = check_rank_seeds(observations, framework)
    assert len(failures) == (1 if complaint else 0), failures
    assert all(failure.observed.startswith(complaint) and failure.keys == framework.start_keys for failure in failures)
    assert all("seed each rank again from --seed and its rank" in failure.observed for failure in failures)


@pytest.mark.parametrize(
    "syncs, complaint",
    [
        ([(1, 2), (1, 2)], None),  # accumulation with no_sync: one allreduce per step
        ([(1, 1), (1, 1)], None),  # no accumulation
        ([], None),  # a framework whose gradient communications are not watched
        ([(1, 2), (2, 2)], "rank 1 averaged the gradients over the ranks in 2 of the 2 backward passes of step 2"),
    ],
)
def test_a_step_that_averages_the_gradients_per_micro_batch_is_named(syncs, complaint):
    failures = check_accumulation(
        [_observation(0, gradient_syncs=[(1, 2)] * len(syncs)), _observation(1, gradient_syncs=syncs)]
    )
    assert [failure.observed.split(",")[0] for failure in failures] == ([complaint] if complaint else [])
    assert all(failure.keys == ("no-sync",) and "no_sync()" in failure.observed for failure in failures)


def test_the_check_counts_the_backward_passes_in_which_ddp_communicates(monkeypatch):
    """The DDP backend's watch sees each backward that reduces, and none run inside no_sync (1 rank, gloo)."""
    monkeypatch.setattr(DistributedDataParallel, "__init__", DistributedDataParallel.__init__)  # put back after
    communicated, backward = [], [0]
    backend_class("ddp").script_hooks.watch_gradient_syncs(lambda: communicated.append(backward[0]))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        for number in (1, 2, 3):
            backward[0] = number
            with model.no_sync() if number == 1 else contextlib.nullcontext():
                model(torch.ones(3, 4)).sum().backward()
        assert sorted(set(communicated)) == [2, 3], communicated
    finally:
        dist.destroy_process_group()


# --- harness check on broken scripts -----------------------------------------------------------

# Pieces of broken variants: each replaces text that occurs once in every solution it is used on.
ADAM = (
    "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)",
    "optimizer = torch.optim.Adam(model.parameters(), lr=lr)",
)
GPU_BY_GLOBAL_RANK = ('device = torch.device("cuda", local_rank)', 'device = torch.device("cuda", rank)')
REPORT = "        workshop.report(epoch, train_sums, test_sums)\n"
# Every rank seeded alike for good: the same dropout masks on every rank.
SAME_SEED = ("torch.manual_seed(args.seed * 1000 + rank + 1)\n", "")
SAME_SEED_WORDS = "every rank started training from the same random state, so with dropout on they draw the same"
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
    # Seeded alike for good, the ranks shuffle alike: every rank trains on the same samples.
    "ddp-no-wrap-same-seed-no-sampler-lr-unscaled-whole-test-set-every-rank-saves-and-prints": (
        "02_ddp.py",
        [
            ('model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)\n', ""),
            SAME_SEED,
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
            "rank seeds": ("wrap", SAME_SEED_WORDS),
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
    "deepspeed-default-clipping-nothing-saved-same-seed": (
        "04_deepspeed.py",
        [
            ('    "gradient_clipping": 0.0,\n', ""),
            ("if rank == 0:\n    torch.save(engine.module.state_dict(), args.save)\n", ""),
            SAME_SEED,
        ],
        {
            "one process": ("config", "clips the gradient norm at 1"),
            "rank 0 writes": ("save", "rank 0 did not save the model to --save model.pt"),
            "rank seeds": ("initialize", SAME_SEED_WORDS),
        },
    ),
    "ddp-saves-the-wrapped-model": (  # DDP's own state dict: its keys start with `module.`
        "02_ddp.py",
        [("torch.save(model.module.state_dict()", "torch.save(model.state_dict()")],
        {"rank 0 writes": ("save", "has keys the plain model lacks (module.")},
    ),
    "fsdp-saves-its-shards-same-seed": (  # the sharded model's own state dict: DTensors, each rank's pieces
        "06_fsdp.py",
        [
            (
                "weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))",
                "weights = model.state_dict()",
            ),
            SAME_SEED,
        ],
        {
            "rank 0 writes": ("save", "as a DTensor, the ranks' pieces of a sharded weight, not a whole tensor"),
            "rank seeds": ("shard-model", SAME_SEED_WORDS),
        },
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
    "ddp-adam-linear-without-warmup": (  # notebook 02: Adam at the linear LR stalls unless warmed up
        "02_ddp.py",
        [ADAM],
        {"learning rate": ("lr", "for Adam the exercise scales it by the square-root rule, --lr x sqrt(2)")},
    ),
    "ddp-adam-lr-unscaled-gpu-by-global-rank": (  # a GPU by the global rank: at 2 simulated nodes
        "02_ddp.py",
        [ADAM, ("lr = args.lr * world_size", "lr = args.lr"), GPU_BY_GLOBAL_RANK],
        {
            "learning rate": (
                "lr",
                "for Adam the exercise scales it by the square-root rule, --lr x sqrt(2) = 0.03536; the linear "
                "one, --lr x 2 = 0.05, only with a warmup (notebook 02: without, Adam stalls)",
            ),
            "device": ("process-group", "rank 1 picks GPU 1, its global rank (line "),
        },
    ),
    "horovod-gpu-by-global-rank-nothing-printed-same-seed": (
        "03_horovod.py",
        [GPU_BY_GLOBAL_RANK, (REPORT, "        pass\n"), SAME_SEED],
        {
            "device": ("init", "but it is local rank 0 on its node"),
            "metrics": ("metrics", "rank 0 printed no epoch line"),
            "rank seeds": ("broadcast", SAME_SEED_WORDS),
        },
    ),
    "accumulation-allreduces-every-micro-batch": (  # the same weights, twice the allreduces
        "07_accumulation.py",
        [
            (
                "sync = model.no_sync() if number < len(parts) else contextlib.nullcontext()",
                "sync = contextlib.nullcontext()",
            )
        ],
        {
            "accumulation": (
                "no-sync",
                "rank 0 averaged the gradients over the ranks in 2 of the 2 backward passes of step 1, where once "
                "per step gives the same gradients: run the forward and backward of every micro-batch but the last "
                "inside the DDP model's no_sync()",
            )
        },
    ),
    "accumulation-never-averages": (  # no_sync on the last micro-batch too
        "07_accumulation.py",
        [("sync = model.no_sync() if number < len(parts) else contextlib.nullcontext()", "sync = model.no_sync()")],
        {"same end": ("no-sync", "started alike but ended with different weights")},
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

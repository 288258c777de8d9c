"""`harness recommend`: at each node count the fastest backend case whose predicted memory fits, cases
within the prediction's uncertainty named together, never a case that does not fit; too large a
task for every case is one line naming the fix, computed from the figures. In-process, on a small
built-in transformer (synthetic tokens) against Polaris's profile with a published throughput."""

from __future__ import annotations

import json

import pytest

from harness.backends.memory import GIB, Training
from harness.cli import main
from harness.errors import UsageError
from harness.study.prediction.memory import backend_cases, memory_rows, task_activations
from harness.study.prediction.predict import BACKWARD_SHARE, Workload, network_from_site, predict_scaling
from harness.study.prediction.predict_cli import with_node_and_traffic
from harness.study.prediction.recommend import TIE_SHARE, Capacity, choose, recommend
from harness.study.prediction.shapes import task_shape

TASK_ARGS = {"tokens": "synthetic", "layers": 2, "width": 256, "heads": 4, "sequence_length": 64}
NODES = [1, 2, 8, 32]
BATCH, THROUGHPUT = 8, 400.0
TRAINING = Training(precision="bf16", optimizer="adam", micro_batch=BATCH)
FLAGS = [
    "recommend",
    "--site",
    "polaris",
    "--task",
    "transformer",
    *(word for key, value in TASK_ARGS.items() for word in ("--task-arg", f"{key}={value}")),
    "--throughput",
    str(THROUGHPUT),
    "--batch-size",
    str(BATCH),
    "--precision",
    "bf16",
    "--optimizer",
    "adam",
]
# ZeRO-3 with DeepSpeed's default buckets holds 1.9 GiB whatever the model: a small bucket lets the
# small model's sharding show against DDP's whole copies.
SHARDED = [("deepspeed", {"zero_stage": 3, "zero_bucket_mb": 1}), ("fsdp", {})]


def _workload() -> Workload:
    compute = BATCH / THROUGHPUT
    return Workload(
        compute_s=compute,
        backward_s=BACKWARD_SHARE * compute,
        overhead_s=0.0,
        gradient_bytes=task_shape("transformer", TASK_ARGS).parameter_bytes,
        bucket_bytes=25 * 2**20,
        overlap=1.0,
        local_batch=BATCH,
        source="test",
    )


def _recommend(capacity_bytes: int, cases=None, nodes=NODES):
    network = network_from_site("polaris")
    capacity = Capacity(capacity_bytes, "test cap", "test")
    return recommend(network, _workload(), "transformer", TASK_ARGS, TRAINING, capacity, nodes, cases)


def _at(rows, count):
    return [row for row in rows if row["nodes"] == count]


def test_the_choice_is_the_fastest_that_fits_or_one_within_the_uncertainty(tmp_path, capsys):
    out = tmp_path / "recommend.json"
    assert main([*FLAGS, "--nodes", ",".join(map(str, NODES)), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    cases = backend_cases(None, {})
    assert len(document["rows"]) == len(cases) * len(NODES)
    assert [choice["nodes"] for choice in document["choices"]] == NODES
    for choice in document["choices"]:
        rows = _at(document["rows"], choice["nodes"])
        fitting = [row for row in rows if row["fits"]]
        fastest = min(row["step_s"] for row in fitting)
        near = {row["backend"] for row in fitting if row["step_s"] <= fastest * (1 + TIE_SHARE)}
        chosen = next(row for row in rows if row["backend"] == choice["backend"])
        assert chosen["fits"] and chosen["memory_bytes"] <= 40 * GIB
        assert set(choice["tied"]) == near and choice["backend"] in near
        assert chosen["wire_bytes"] == min(row["wire_bytes"] for row in fitting if row["backend"] in near)
        assert choice["line"] in printed
    assert "| nodes | backend" in printed and f"within {TIE_SHARE:.0%} of the fastest" in printed


def test_the_rows_hold_predicts_own_memory_and_step_for_each_backend(tmp_path):
    out = tmp_path / "recommend.json"
    assert main([*FLAGS, "--nodes", "2,8", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    network, shape = network_from_site("polaris"), task_shape("transformer", TASK_ARGS)
    activations = task_activations("transformer", TASK_ARGS, "bf16")
    cases = backend_cases(None, {})
    memory = memory_rows(shape, cases, TRAINING, activations, [2 * 4, 8 * 4])
    for (name, options), (_, per_size) in zip(cases, memory):
        traffic = with_node_and_traffic(_workload(), [], 4, name, options.as_dict(), shape)
        predicted = predict_scaling(traffic, network, [2, 8])
        own = [row for row in rows if row["backend"] == per_size[0].backend]
        assert [row["memory_bytes"] for row in own] == [prediction.total() for prediction in per_size]
        assert [row["step_s"] for row in own] == pytest.approx([row["step_s"] for row in predicted])
        assert [row["throughput"] for row in own] == pytest.approx([row["throughput"] for row in predicted])


def test_a_case_that_does_not_fit_is_never_chosen():
    cases = [("ddp", {}), *SHARDED]
    free = _recommend(1000 * GIB, cases)
    ddp = [row for row in free.rows if row["backend"] == "ddp"]
    sharded = [row for row in free.rows if row["backend"] != "ddp"]
    assert min(row["memory_bytes"] for row in ddp) > max(row["memory_bytes"] for row in sharded)
    cap = (min(row["memory_bytes"] for row in ddp) + max(row["memory_bytes"] for row in sharded)) // 2
    capped = _recommend(cap, cases)
    assert {row["backend"] for row in capped.rows if not row["fits"]} == {"ddp"}
    assert all(row["fits"] for row in capped.rows if row["backend"] != "ddp")
    assert all(choice.backend != "ddp" and "ddp" not in choice.tied for choice in capped.choices)
    assert all(choice.backend is not None for choice in capped.choices)


def test_the_memory_cap_flag_sets_the_capacity_and_must_be_positive(tmp_path, capsys):
    out = tmp_path / "recommend.json"
    assert main([*FLAGS, "--nodes", "1", "--memory-cap", "1.5", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["capacity"]["bytes"] == int(1.5 * GIB)
    assert all(row["fits"] == (row["memory_bytes"] <= 1.5 * GIB) for row in document["rows"])
    assert any(not row["fits"] for row in document["rows"]) and any(row["fits"] for row in document["rows"])
    capsys.readouterr()
    for bad in ("0", "-2", "nan"):
        assert main([*FLAGS, "--memory-cap", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--memory-cap must be a positive number of GiB" in err


def test_a_task_too_large_everywhere_is_one_line_naming_the_fix(tmp_path, capsys):
    free = _recommend(1000 * GIB, nodes=[1, 2])
    one, two = (min(row["memory_bytes"] for row in _at(free.rows, count)) for count in (1, 2))
    assert two < one  # sharded state shrinks with the ranks
    cap_gib = (one + two) / 2 / GIB
    out = tmp_path / "recommend.json"
    assert main([*FLAGS, "--nodes", "1", "--memory-cap", f"{cap_gib!r}", "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and not out.exists()
    assert f"needs {one / GIB:.1f} GiB a rank" in captured.err
    assert "use 2 nodes or more (--nodes)" in captured.err and "a smaller model" in captured.err
    with pytest.raises(UsageError, match="no backend fits") as error:
        _recommend(2**20, nodes=[1, 2])  # 1 MiB: less than the activations alone
    assert "--nodes" not in str(error.value) and "a smaller model" in str(error.value)


def test_steps_within_the_uncertainty_are_not_ranked():
    def row(backend, step, sent, gib=1.0):
        return {
            "backend": backend,
            "nodes": 8,
            "step_s": step,
            "throughput": 8 / step,
            "wire_bytes": sent,
            "memory_bytes": int(gib * GIB),
            "fits": gib <= 40,
        }

    # a is the fastest that fits; b, within TIE_SHARE of it, sends less; c, sending least, is beyond it
    rows = [row("a", 1.00, 300), row("b", 1.10, 200), row("c", (1 + TIE_SHARE) * 1.01, 100), row("d", 0.5, 100, 50)]
    choice = choose(rows, Capacity(40 * GIB, "40 GiB", "test"))
    assert choice.backend == "b" and choice.tied == ("b", "a")  # the tie rule's order: fewest bytes first
    assert "b, a within 15% of the fastest" in choice.line and "d would be faster but needs 50.0 GiB" in choice.line
    assert "least traffic (0.0 MiB a step) (" in choice.line  # b sends less than a: no second criterion
    level = choose([row("y", 1.05, 200), row("x", 1.00, 200)], Capacity(40 * GIB, "40 GiB", "test"))
    assert level.backend == "y" and "then the least sharding" in level.line  # equal bytes: the listed order
    alone = choose([rows[0], rows[2]], Capacity(40 * GIB, "40 GiB", "test"))
    assert alone.backend == "a" and alone.tied == ("a",) and "the next that fits, c, is 16% slower" in alone.line


def test_a_backend_the_sites_software_cannot_run_is_never_a_choice_there(tmp_path, capsys):
    """A site whose profile says its software cannot run Horovod (as Aurora's does on its XPUs): Horovod
    is left out of the rows and the choices, and the assumptions say so."""
    from harness.study.sites import SITES_DIR

    profile = json.loads(open(f"{SITES_DIR}/polaris.json").read())
    profile["unsupported_backends"] = ["horovod"]
    site = tmp_path / "no-horovod.json"
    site.write_text(json.dumps(profile))
    out = tmp_path / "recommend.json"
    flags = [word if word != "polaris" else str(site) for word in FLAGS]
    assert main([*flags, "--nodes", "1,2", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    backends = {row["backend"].split()[0] for row in document["rows"]}
    assert "horovod" not in backends and {"ddp", "fsdp", "deepspeed"} <= backends
    assert all(choice["backend"] != "horovod" for choice in document["choices"])
    assert "left out: horovod, which the site's software cannot run" in capsys.readouterr().out

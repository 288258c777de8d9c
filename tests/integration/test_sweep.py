"""harness sweep for real: every run a process of its own, the CLI as a command."""

from __future__ import annotations

import json
import shlex

import pytest

from harness.training.record import read_records
from tests.conftest import REPO, harness
from tests.unit.test_sweep import BACKENDS, DEFAULT_TUNING


def test_sweep_cli_dry_run_and_one_line_errors(tmp_path):
    results = str(tmp_path / "r.jsonl")
    dry = harness(
        "sweep",
        "--backends",
        "none,ddp",
        "--ranks",
        "1,2",
        "--scaling",
        "weak",
        "--model",
        "cnn",
        "--max-steps",
        "5",
        "--results",
        results,
        "--dry-run",
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr
    commands = [shlex.split(line) for line in dry.stdout.splitlines()]
    assert len(commands) == 9 and all("--max-steps" in c and "--model" in c for c in commands)  # 3 repeats
    bad = harness(
        "sweep", "--backends", "ddp", "--ranks", "1,two", "--scaling", "weak", "--results", results, timeout=120
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "harness sweep: error: --ranks takes positive integers separated by commas, got 'two'"
    ]
    one_rank = ["sweep", "--backends", "ddp", "--ranks", "1", "--scaling", "weak", "--results", results]
    unknown = harness(*one_rank, "--modell", "cnn", timeout=120)
    assert unknown.returncode == 2 and "unrecognized arguments: --modell cnn" in unknown.stderr
    # A task that cannot load fails once, in the sweep's own process, before any run.
    missing = harness(*one_rank, "--task", "nothing.py:make")
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        f"harness sweep: error: task '{REPO}/nothing.py:make': file {REPO}/nothing.py does not exist; "
        "fix --task (a path, then :FUNCTION)"
    ]
    assert not (tmp_path / "r.jsonl").exists()


# A task of the researcher's own (tests/helpers/tasks.py), named by its file's path relative to where
# the sweep runs: every run gets it as an absolute path.
TASK = "tests/helpers/tasks.py:regression"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A real weak-scaling sweep of a task of one's own: every distributed backend on 1 and 2 ranks,
    10 short steps each."""
    out = tmp_path_factory.mktemp("sweep")
    results = out / "weak.jsonl"
    result = harness(
        "sweep",
        "--backends",
        ",".join(BACKENDS),
        "--ranks",
        "1,2",
        "--scaling",
        "weak",
        "--task",
        TASK,
        "--batch-size",
        "16",
        "--max-steps",
        "10",
        "--timing-warmup-steps",
        "3",
        "--calibration-steps",
        "3",
        "--repeats",
        "1",
        "--eval-every",
        "0",
        "--results",
        str(results),
        "--sweep-id",
        "e2e",
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, results, result.stdout


@pytest.mark.slow
def test_sweep_records_are_complete(swept):
    _, results, stdout = swept
    records = read_records([str(results)])
    assert sorted((r["backend"], r["world_size"]) for r in records) == sorted(
        (backend, ranks) for backend in BACKENDS for ranks in (1, 2)
    )
    for record in records:
        assert (record["task"]["spec"], record["task"]["args"]) == (f"{REPO}/{TASK}", {})
        assert (record["model"], record["dataset"]) == ("mlp-bn-32", "points")
        order = record["tags"].pop("order")
        assert record["tags"] == {"scaling": "weak", "sweep_id": "e2e", "repeat": "0", "order_seed": "0"}
        assert order.endswith(f"/{len(records)}")
        assert record["local_batch"] == 16 and record["global_batch"] == 16 * record["world_size"]
        assert record["timed_steps"] == 7 and record["throughput"] > 0
        assert 0 < record["au"] <= 1
        reduces = {"gradient_allreduce": record["world_size"] > 1} if "gradient_allreduce" in record["tuning"] else {}
        if record["backend"] == "ddp":  # the metered allreduce hook, registered where there is a peer
            reduces["comm_hook"] = "default allreduce_hook (metered)" if record["world_size"] > 1 else None
        # FSDP's units are the model's top-level children with parameters, and the root.
        units = {"fsdp_units": len(record["task"]["unit_bytes"]) + 1} if record["backend"] == "fsdp" else {}
        assert record["tuning"] == {
            **DEFAULT_TUNING[record["backend"]],
            **units,
            **reduces,
            "cpu_malloc": "reuse",
            "pinned_cores": None,
            "channels_last_weights": False,
            "compile": None,
            "heartbeat": record["world_size"] > 1,  # one rank has no peer to name
        }
        assert record["threads_per_rank"] == 1 and "1 compute thread(s)" in record["contention"]["oversubscription"]
        for metric in ("load_balance", "communication_efficiency", "parallel_efficiency"):
            assert 0 < record[metric] <= 1, (record["backend"], metric, record[metric])
        breakdown = record["step_breakdown"]
        assert all(len(values) == record["world_size"] for values in breakdown["per_rank_seconds"].values())
        per_step = breakdown["seconds_per_step"]
        parts = sum(per_step[k] for k in ("data_wait", "forward_backward", "communication", "optimizer", "other"))
        assert parts == pytest.approx(per_step["runtime"])
    assert f"sweep e2e: {2 * len(BACKENDS)} record(s)" in stdout


@pytest.mark.slow
def test_plot_and_report_of_the_sweep(swept):
    out, results, _ = swept
    plotted = harness("plot", str(results), "-o", str(out / "fig"), timeout=300)
    assert plotted.returncode == 0, plotted.stderr
    for kind in ("throughput", "efficiency", "breakdown"):
        for ext in ("png", "svg", "json"):
            assert (out / f"fig-{kind}.{ext}").stat().st_size > 0
    metadata = json.loads((out / "fig-throughput.json").read_text())
    assert sorted(series["backend"] for series in metadata["series"]) == sorted(BACKENDS)  # runs' order is random
    assert all(series["workers"] == [1, 2] for series in metadata["series"])
    assert "Weak scaling: mlp-bn-32 on points (tasks.py:regression), 16 samples per worker" in metadata["title"]

    report = harness("report", str(results), timeout=300)
    assert report.returncode == 0, report.stderr
    records = read_records([str(results)])
    digest = records[0]["task"]["sha256"]
    assert f"- task {REPO}/{TASK} ({REPO}/tests/helpers/tasks.py, sha256 {digest[:12]})" in report.stdout
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in report.stdout.splitlines()
        if line.startswith("|")
    ][2:]
    # A run measured on a busy machine is marked † (and explained under the table).
    assert sorted((row[0].removesuffix(" †"), row[1]) for row in rows) == sorted(
        (backend, str(ranks)) for backend in BACKENDS for ranks in (1, 2)
    )
    assert all(row[2] == "1" for row in rows)  # the same threads per rank at 1 and 2 ranks
    assert all(row[6].removesuffix(" ?") != "-" for row in rows)  # every configuration has an efficiency
    assert ("†" in report.stdout) == any(r["contention"]["flagged"] for r in records)

    # The prediction prices FSDP's traffic on the task's own model, as its runs recorded it.
    prediction = out / "prediction.json"
    predicted = harness(
        "predict", "--site", "polaris", "--record", str(results), "--backend", "fsdp", "--json", str(prediction)
    )
    assert predicted.returncode == 0, predicted.stderr
    workload = json.loads(prediction.read_text())["workload"]
    shape = records[0]["task"]
    assert workload["gradient_bytes"] == shape["parameter_bytes"] == records[0]["gradient_bytes"]
    units = [call["bytes"] for call in workload["calls"] if call["phase"] == "forward_gather"]
    assert units == shape["unit_bytes"] and len(units) == 3  # the MLP's two linear layers and its batch norm

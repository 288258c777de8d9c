"""The data path under real launchers: exact evaluation at any world size, prepare-once, no network.

Every subprocess here runs with tests/no_network/sitecustomize.py on its path, which refuses and
records any attempt to reach another machine; loopback (gloo, torchrun's store) stays open.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import TrainConfig, train
from harness.process.launchers import launch_environment
from harness.training.launch import launch_command
from tests.conftest import LAUNCH_TIMEOUT_S, REPO, run
from tests.helpers.data_files import write_digits_as_mnist

GUARD_DIR = os.path.join(REPO, "tests", "no_network")
TEST_SIZE = 101  # prime: no world size of 2-5 splits it evenly


@pytest.fixture
def offline(tmp_path):
    """Environment for subprocesses with the network guard on; fails the test if anything tried to connect."""
    log = tmp_path / "network-attempts.log"
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [GUARD_DIR, os.environ.get("PYTHONPATH")])),
        "HARNESS_NETWORK_GUARD_LOG": str(log),
    }
    yield env
    assert not log.exists(), f"code under test tried to reach the network:\n{log.read_text()}"


def guarded(command, env, timeout=LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess:
    result = run(command, env=env, timeout=timeout)
    assert result.returncode == 0, (
        f"{command}: exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    )
    return result


def last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def test_guard_refuses_and_records_a_deliberate_connection(tmp_path):
    log = tmp_path / "log"
    code = (
        "import socket\n"
        "server = socket.create_server(('127.0.0.1', 0)); socket.create_connection(server.getsockname()).close()\n"
        "try:\n    socket.socket().connect(('192.0.2.1', 80))\nexcept PermissionError as exc:\n    print(exc)\n"
    )
    result = run(
        [sys.executable, "-c", code], env={"PYTHONPATH": GUARD_DIR, "HARNESS_NETWORK_GUARD_LOG": str(log)}, timeout=60
    )
    assert result.returncode == 0, result.stderr  # loopback worked
    assert "network access blocked by the test guard: connect to ('192.0.2.1', 80)" in result.stdout
    assert "connect to ('192.0.2.1', 80)" in log.read_text()


@pytest.mark.slow
def test_evaluation_at_three_ranks_equals_one_rank(tmp_path, offline):
    data_dir, model_file = str(tmp_path / "data"), str(tmp_path / "model.pt")
    write_digits_as_mnist(data_dir, TEST_SIZE)
    trained = train(
        TrainConfig(
            task_args={"dataset": "mnist", "data_dir": data_dir},
            max_steps=40,
            batch_size=32,
            lr=0.05,
            threads=1,
            save_model=model_file,
        )
    )
    args = ["--dataset", "mnist", "--data-dir", data_dir, "--model-file", model_file, "--threads", "1"]
    one = last_json(guarded(launch_command(1, "none", args, subcommand="evaluate"), offline).stdout)
    three = last_json(guarded(launch_command(3, "ddp", args, "torchrun", subcommand="evaluate"), offline).stdout)
    assert (one["world_size"], three["world_size"]) == (1, 3)
    assert one["eval_samples"] == three["eval_samples"] == trained["eval_samples"] == TEST_SIZE
    assert one["eval_accuracy"] == three["eval_accuracy"] == trained["eval_accuracy"] > 0.5
    assert three["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-6)


@pytest.mark.slow
def test_two_rank_training_prepares_once_with_loader_workers_and_no_network(tmp_path, offline):
    data_dir, results = str(tmp_path / "data"), str(tmp_path / "results.jsonl")
    write_digits_as_mnist(data_dir, TEST_SIZE)  # raw files only: the job itself must prepare them
    result = guarded(
        launch_command(
            2,
            "ddp",
            [
                "--dataset",
                "mnist",
                "--data-dir",
                data_dir,
                "--max-steps",
                "20",
                "--batch-size",
                "32",
                "--num-workers",
                "2",
                "--results",
                results,
            ],
            "torchrun",
        ),
        offline,
    )
    assert result.stdout.count("harness: preparing mnist") == 1, result.stdout
    record = json.loads(open(results).read())
    assert record["world_size"] == 2 and record["steps"] == 20 and record["eval_samples"] == TEST_SIZE
    assert 0 < record["au"] <= 1


@pytest.mark.slow
def test_concurrent_prepares_elect_one_preparer(tmp_path, offline):
    data_dir = str(tmp_path / "data")
    write_digits_as_mnist(data_dir, TEST_SIZE)
    command = [sys.executable, "-m", "harness", "data", "prepare", "mnist", "--data-dir", data_dir]
    processes = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=launch_environment(offline),
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=LAUNCH_TIMEOUT_S) for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    stdout = "".join(out for out, _ in outputs)
    assert stdout.count("harness: preparing mnist") == 1 and stdout.count("mnist prepared in") == 1, stdout
    assert stdout.count("mnist was already prepared in") == 2
    assert sorted(os.listdir(os.path.join(data_dir, "prepared"))) == ["mnist"]


@pytest.mark.slow
def test_download_uses_files_already_present_and_fails_cleanly_offline(tmp_path, offline):
    present = str(tmp_path / "present")
    write_digits_as_mnist(present, TEST_SIZE)  # torchvision's layout: its downloader finds the files and stops
    result = guarded([sys.executable, "-m", "harness", "data", "download", "mnist", "--data-dir", present], offline)
    assert f"next: `harness data prepare mnist --data-dir {present}`" in result.stdout
    # Empty directory: torchvision tries the internet, the guard refuses, the harness reports one line.
    log = offline["HARNESS_NETWORK_GUARD_LOG"] + ".expected"
    result = run(
        [sys.executable, "-m", "harness", "data", "download", "mnist", "--data-dir", str(tmp_path / "empty")],
        env={**offline, "HARNESS_NETWORK_GUARD_LOG": log},
        timeout=120,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"harness data: error: downloading mnist into {tmp_path / 'empty'} failed")
    assert "internet access" in line and os.path.exists(log)

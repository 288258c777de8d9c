"""Any sequence of runs in one process behaves as if each were the first (notebook engines run
several): the record names the real launcher every time, no run's settings leak into the next,
every run trains the same weights, and a process group or Horovod the caller set up is used and
left as it was."""

from __future__ import annotations

import os
import sys

import torch

import harness
from harness import TrainConfig
from tests.helpers.weights import load_weights, max_abs_difference

COMMON = dict(
    task_args={"model": "cnn", "dataset": "digits", "dropout": 0.0},
    seed=0,
    lr=0.05,
    lr_scaling="none",
    max_steps=10,
    threads=1,
    eval_every=0,
    calibration_steps=0,
    timing_warmup_steps=1,
)


def test_the_single_process_backend_twice_in_this_process(tmp_path):
    before = dict(os.environ), torch.get_num_threads()
    records = [
        harness.train(TrainConfig(batch_size=32, save_model=str(tmp_path / f"{n}.pt"), **COMMON)) for n in range(2)
    ]
    assert (dict(os.environ), torch.get_num_threads()) == before
    assert [r["launcher"] for r in records] == ["none", "none"]
    assert records[0]["train_losses"] == records[1]["train_losses"]
    first, second = (load_weights(tmp_path / f"{n}.pt") for n in range(2))
    assert max_abs_difference(first, second) == 0.0
    from harness import train

    assert callable(train) and train is harness.train and callable(sys.modules["harness"].train)

"""Training with data-loader worker processes: the workers change the speed, not the results."""

from __future__ import annotations

from harness import TrainConfig, train


def test_loader_workers_change_speed_not_results():
    base = dict(max_steps=12, batch_size=32, threads=1, timing_warmup_steps=2)
    in_process = train(TrainConfig(**base))
    workers = train(TrainConfig(num_workers=2, prefetch=2, **base))
    assert workers["eval_loss"] == in_process["eval_loss"] and workers["train_losses"] == in_process["train_losses"]
    for record in (in_process, workers):
        assert 0 < record["au"] <= 1

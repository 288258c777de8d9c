"""A rank that computes longer than the others: the workshop CNN whose forward pass waits a known
time on chosen ranks, and logs how long each wait really took.

Under a launcher this file is the program each rank runs:
    torchrun --nproc-per-node 2 tests/helpers/slow_rank_model.py OUT_DIR DELAY_MS_RANK0,DELAY_MS_RANK1 [train flags]
Each rank trains `harness.train` on a task of that CNN and writes OUT_DIR/rank<R>.json holding
its record and the wall seconds of every wait (time.sleep may oversleep on a busy machine, so the
test uses what the waits took, not what was asked).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from harness.tasks.images import image_task
from harness.tasks.models import WorkshopCNN


class SlowCNN(WorkshopCNN):
    """The workshop CNN; each forward pass first waits `delay` seconds and logs the wait in `waits`."""

    delay = 0.0
    waits: list[float] = []

    def forward(self, images):
        if self.training and self.delay:
            start = time.perf_counter()
            time.sleep(self.delay)
            self.waits.append(time.perf_counter() - start)
        return super().forward(images)


def main(argv: list[str]) -> None:
    from harness.config import OneLineParser
    from harness.process.discovery import detect_cluster
    from harness.training.flags import add_train_flags, config_from_args
    from harness.training.loop import train

    out_dir, delays, train_args = argv[0], [float(ms) / 1000 for ms in argv[1].split(",")], argv[2:]
    rank = detect_cluster().rank
    SlowCNN.delay = delays[rank]

    parser = OneLineParser(prog="slow_rank_model")
    add_train_flags(parser)
    config = config_from_args(parser.parse_args(train_args))
    task = dataclasses.replace(image_task(**config.task_args), build_model=SlowCNN)
    record = train(config, task=task)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"record": record, "waits": SlowCNN.waits}, handle)


if __name__ == "__main__":
    main(sys.argv[1:])

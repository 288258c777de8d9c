"""`harness check FILE`: run an attendee's data-parallel script at 2 ranks and say what is wrong.

How the script runs. Its imports tell its framework (deepspeed, else horovod, else torch.distributed),
named by its backend in harness.backends' registry, and so its real launcher (the deepspeed
launcher, horovodrun, torchrun). Every rank runs `python -m harness.workshop.checker`, which
installs the observers and then runs the script (runpy) in an empty working directory of its own,
with fixed flags: seed 0, dropout off, 2 epochs of the first 5 G + 10 training images, where
G = ranks x 16 is the global batch (5 steps an epoch, 10 in all: harness.study.scaling.equivalence's
EQUIVALENCE_STEPS; the 10 left over are the drop-last tail), and --lr 0.05 / ranks, so that the
global batch trains at harness.study.scaling.equivalence's measured LR 0.05. The framework's collectives
time out (its backend's limit_collective_waits) well before the check does, and at the check's
timeout every rank dumps its Python stack and is killed: a hung script ends with where it hung.
With --simulate-nodes N each rank first takes the place it would have with the ranks dealt out to
N nodes (its local rank, its node; on the CPU), so that a GPU picked by the global rank shows.

What it watches, per rank: the samples fetched from workshop.digits, per pass over a DataLoader
(a training pass is an epoch, a test pass an evaluation) and per optimizer step; the model built by
workshop.build_model (on every rank but 0 its weights are drawn anew, as ranks seeded differently
would draw them: only a broadcast from rank 0 makes them start alike); the weights before the first
step and after the last and the LR of every step (a step that no training batch fed, such as
Horovod's state set-up, is not counted); the flags parsed; the training loss of each batch, the sums
workshop.evaluate returned, what workshop.report reported and what the rank wrote to stdout; the
device index it picks; the config it gives deepspeed.initialize; the random state its first training
forward draws from; per optimizer step, its training forwards and how many of their backward passes
communicated (DDP's buckets, through a comm hook); the files written into the rank's
working directory; its error, and whether its backend calls it a peer's failure.

What must hold is judge's docstring: ten properties, one FAIL line each, naming the TODO that
governs it.

The modules, one job each:
- `observe`: inside each rank, the observers and the run of the script, and the record they leave;
- `control`: the ranks' command, the run directory, the launcher's timeout, the stack dumps;
- `judge`: the properties and the line of a run that did not finish;
- `metrics`, `devices`, `batch`, `seeds`, `accumulation`: what rank 0 prints, the device each rank
  picks (and the simulated nodes), an engine's batch settings, the random state each rank's dropout
  draws from, the backward passes that communicated: each watched in the ranks and judged;
- `todos`: which framework a script uses, and which TODO governs each property (a Failure's keys);
- `check`: `check_script`, which runs the others in turn;
- `cli`: `harness check`'s verdict lines and the ranks' command line (`__main__`).
"""

from .check import CheckResult, check_script
from .cli import check_command
from .todos import Failure

__all__ = ["CheckResult", "Failure", "check_command", "check_script"]

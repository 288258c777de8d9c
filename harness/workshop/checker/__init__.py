"""`harness check FILE`: run an attendee's data-parallel script at 2 ranks and say what is wrong.

How the script runs. Its imports tell its framework (deepspeed, else horovod, else torch.distributed),
named by its backend in harness.backends' registry, and so its real launcher (the deepspeed
launcher, horovodrun, torchrun). Every rank runs `python -m harness.workshop.checker`, which
installs the observers and then runs the script (runpy) in an empty working directory of its own,
with fixed flags: seed 0, dropout off, 2 epochs of the first 5 G + 10 training images, where
G = ranks x 16 is the global batch (5 steps an epoch, 10 in all: harness.study.scaling.equivalence's
EQUIVALENCE_STEPS; the 10 left over are the drop-last tail), and --lr 0.05 / ranks, so that the
global batch trains at most at harness.study.scaling.equivalence's measured LR 0.05 (the linear rule's
LR; notebook 02's rule, lr.RULE, gives 0.05 / sqrt(ranks)). With them go the flags
of its step that its workshop.parse_args call takes (--micro-batches 2, --precision bf16); a step
that takes the resume flags runs twice more, stopped after its first epoch, then resumed; one that
takes the model's size (step 6) once more, on a 70.9M-parameter CNN at 4 ranks within a memory budget
a rank that only a model sharded layer by layer fits (memory). The
framework's collectives time out (its backend's limit_collective_waits) well before the check does, and at the check's
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
forward, and the first of each epoch, draws from; the autocast dtype its training forwards ran
under; per optimizer step, its training forwards and how many of their backward passes communicated
(its backend's watch_gradient_syncs: DDP's buckets, Horovod's allreduces, DeepSpeed's averaging at an
accumulation boundary, FSDP2's reduce-scatters); a resumable script's optimizer state before its
first step and after its last; the files written into the rank's working directory; its error, and
whether its backend calls it a peer's failure.

What must hold is judge's docstring: thirteen properties, one FAIL line each (the resume's, one per
thing it lost), naming the TODO that governs it.

The modules, one job each:
- `observe`: inside each rank, the observers and the run of the script, and the record they leave;
- `control`: the ranks' command, the run directory, the launcher's timeout, the stack dumps;
- `judge`: the properties and the line of a run that did not finish;
- `lr`: the learning rate against notebook 02's rule and the rules its runs could not reject;
- `metrics`, `devices`, `batch`, `seeds`, `accumulation`, `autocast`: what rank 0 prints, the device
  each rank picks (and the simulated nodes), an engine's batch settings, the random state each rank's
  dropout draws from, the backward passes that communicated, the dtype the forwards ran in: each
  watched in the ranks and judged;
- `resume`: a resumable step stopped and resumed, against the run never stopped;
- `memory`: a step that takes the model's size, trained large within a memory budget a rank;
- `todos`: which framework a script uses, and which TODO governs each property (a Failure's keys);
- `check`: `check_script`, which runs the others in turn (and a resumable step's two more runs, a
  memory step's one);
- `cli`: `harness check`'s verdict lines and the ranks' command line (`__main__`).
"""

from .check import CheckResult, check_script
from .cli import check_command
from .todos import Failure

__all__ = ["CheckResult", "Failure", "check_command", "check_script"]

"""Redraw the framework comparison figure the README and docs/ show (`make docs-figure`).

The figure is `harness plot`'s throughput figure of the committed study docs/results/weak-scaling.jsonl,
a small weak-scaling sweep of the distributed backends at 1 and 2 ranks on a 2-core CPU machine:

    harness sweep --backends ddp,horovod,deepspeed,fsdp --ranks 1,2 --scaling weak \
        --max-steps 40 --repeats 3 --sweep-id docs-figure --results docs/results/weak-scaling.jsonl

Run that again (delete the file first) to replace the study, then this to redraw the figure.
Usage: .venv/bin/python tools/docs_figure.py [--results FILE] [--output PNG]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(KIT, "docs", "results", "weak-scaling.jsonl")
FIGURE = os.path.join(KIT, "docs", "images", "weak-scaling-throughput.png")


def redraw(results: str = RESULTS, output: str = FIGURE) -> str:
    """Draw `results`' throughput figure with `harness plot`'s own code into `output`; its path."""
    import harness
    from harness.study.scaling.plot import write_figures

    with tempfile.TemporaryDirectory() as scratch:
        written = write_figures(harness.read_results(results), os.path.join(scratch, "study"))
        drawn = next(path for path in written if path.endswith("-throughput.png"))
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        shutil.copyfile(drawn, output)
    return output


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", default=RESULTS, help="the study's results file (default: %(default)s)")
    parser.add_argument("--output", default=FIGURE, help="the PNG to write (default: %(default)s)")
    args = parser.parse_args(argv)
    print(redraw(args.results, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

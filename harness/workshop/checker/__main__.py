"""`python -m harness.workshop.checker ...`: one rank of `harness check` (see cli.rank_main)."""

import sys

from .cli import rank_main

rank_main(sys.argv[1:])

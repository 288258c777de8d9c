"""`python -m harness` is the `harness` command."""

from .cli import run_and_exit

run_and_exit()

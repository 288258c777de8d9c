"""Errors and exit statuses shared by the CLI and the Python API."""

EXIT_OK = 0
EXIT_USAGE = 2  # bad input: flags, environment, files; nothing was started or written
EXIT_PREEMPTED = 3  # stopped by SIGTERM/SIGUSR1 after writing a checkpoint; resubmit to continue
EXIT_PEER_FAILURE = 4  # another rank died or a collective timed out


class UsageError(Exception):
    """Bad input. The CLI prints the message as one line and exits with status 2.

    Messages say what is wrong and name the fix, e.g. "unknown backend 'dpp'; choose one of ...".
    """

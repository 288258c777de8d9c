"""Network guard for test subprocesses: put this directory first on PYTHONPATH.

When HARNESS_NETWORK_GUARD_LOG is set, every Python-level attempt to reach another machine (a
connect to a non-loopback address, or a DNS lookup of a name that is not this host) is refused
with an OSError and recorded in that file, so a test still sees it when the code under test
swallows the error. Loopback stays open: gloo and torchrun rendezvous on 127.0.0.1.
"""

import ipaddress
import os
import socket
import sys

_LOG = os.environ.get("HARNESS_NETWORK_GUARD_LOG")
_LOCAL_NAMES = {None, "", b"", "localhost", b"localhost", socket.gethostname(), socket.gethostname().encode()}


def _is_loopback(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return host in _LOCAL_NAMES
    return address.is_loopback or address.is_unspecified


def _refuse(what: str) -> None:
    with open(_LOG, "a") as log:
        log.write(f"{os.getpid()} {what}\n")
    raise PermissionError(f"network access blocked by the test guard: {what}")


def _guard(event: str, args: tuple) -> None:
    if event == "socket.connect":
        sock, address = args
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            _refuse(f"connect to {address!r}")
    elif event == "socket.getaddrinfo" and not _is_loopback(args[0]):
        _refuse(f"resolve {args[0]!r}")


if _LOG:
    sys.addaudithook(_guard)

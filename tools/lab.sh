#!/usr/bin/env bash
# JupyterLab from the kit's environment, started wherever an attendee is (`make lab`):
# - on a laptop or desktop: it opens a browser on notebooks/;
# - on a remote node (REMOTE=1, or LAB_IP=ADDRESS): no browser, a fixed --ip and --port, and it
#   prints the URL to open and the `ssh -L` tunnel that reaches it from a laptop.
# As root (containers, cloud VMs) it adds --allow-root, which Jupyter otherwise demands.
#
#   tools/lab.sh [--dry-run] [-- EXTRA JUPYTER LAB FLAGS]
#
# Settings, from the environment (make passes `make lab REMOTE=1 LAB_PORT=9000` on):
#   VENV       the kit's environment (default .venv)
#   REMOTE     1: run for a browser elsewhere (default 0; also implied by LAB_IP)
#   LAB_IP     address to listen on (default 0.0.0.0 with REMOTE=1, so a tunnel through a login
#              node reaches it; 127.0.0.1 when the tunnel ends on this host; Jupyter's default otherwise)
#   LAB_PORT   port (default: the first free one from 8888 + uid % 1000, so each user on a shared
#              login node keeps the same port, and the same tunnel, from one start to the next)
#   LAB_ROOT   the folder JupyterLab serves (default: the kit, so exercises/ and my-exercises/ show)
#   LAB_OPEN   what it opens in it (default notebooks)
#   JUPYTER_TOKEN  the token (default: a new random one); read from the environment, never put on
#              the command line, where other users of a shared node could read it in `ps`.
# --dry-run prints the jupyter command and the URL lines instead of starting anything.
set -euo pipefail

KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$KIT/$VENV" ;; esac
REMOTE="${REMOTE:-0}"
LAB_IP="${LAB_IP:-}"
LAB_PORT="${LAB_PORT:-}"
LAB_ROOT="${LAB_ROOT:-$KIT}"
LAB_OPEN="${LAB_OPEN:-notebooks}"
DRY_RUN=0

say() { printf '[lab] %s\n' "$*"; }
fail() { printf 'tools/lab.sh: error: %s\n' "$*" >&2; exit 2; }

while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; break ;;
    *) fail "unknown argument '$1'; use --dry-run, then -- and JupyterLab's own flags" ;;
  esac
done

JUPYTER="$VENV/bin/jupyter"
PY="$VENV/bin/python"
[ -x "$JUPYTER" ] || fail "$JUPYTER not found; run 'make setup' first (or set VENV to the kit's environment)"
[ -d "$LAB_ROOT" ] || fail "LAB_ROOT $LAB_ROOT is not a folder; set LAB_ROOT to the folder to serve"
case "$REMOTE" in 0|1) ;; *) fail "REMOTE=$REMOTE; use REMOTE=1 (a remote node) or leave it unset" ;; esac
[ -n "$LAB_IP" ] && REMOTE=1

# A port nobody listens on: LAB_PORT as given, else the first free one from this user's own.
free_port() {
  "$PY" - "$1" <<'EOF'
import socket, sys
start = int(sys.argv[1])
for port in range(start, start + 200):
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            continue
    print(port)
    break
else:
    sys.exit(f"no free port in {start}..{start + 199}; set LAB_PORT")
EOF
}

args=(lab "--ServerApp.root_dir=$LAB_ROOT")
[ "$(id -u)" = 0 ] && args+=(--allow-root)  # Jupyter refuses to run as root without it
if [ "$REMOTE" = 1 ]; then
  LAB_IP="${LAB_IP:-0.0.0.0}"
  case "$LAB_PORT" in
    "") LAB_PORT="$(free_port "$((8888 + $(id -u) % 1000))")" ;;
    *[!0-9]*) fail "LAB_PORT=$LAB_PORT is not a port number; e.g. LAB_PORT=8888" ;;
  esac
  export JUPYTER_TOKEN="${JUPYTER_TOKEN:-$("$PY" -c 'import secrets; print(secrets.token_hex(24))')}"
  # port_retries=0: the printed URL and tunnel stay right (Jupyter would otherwise move to another port).
  args+=(--no-browser "--ip=$LAB_IP" "--port=$LAB_PORT" --ServerApp.port_retries=0)
else
  [ -n "$LAB_PORT" ] && args+=("--port=$LAB_PORT")
  args+=("$LAB_OPEN")  # the laptop's browser opens on it
fi
args+=("$@")

if [ "$REMOTE" = 1 ]; then
  host="$(hostname -f 2>/dev/null || hostname)"
  user="${USER:-$(id -un)}"
  path="lab/tree/$LAB_OPEN"
  say "JupyterLab on $host, port $LAB_PORT (listening on $LAB_IP), serving $LAB_ROOT"
  say "open: http://localhost:$LAB_PORT/$path?token=$JUPYTER_TOKEN"
  if [ "$LAB_IP" = 127.0.0.1 ] || [ "$LAB_IP" = localhost ]; then
    say "from your laptop, tunnel to this host first: ssh -N -L $LAB_PORT:localhost:$LAB_PORT $user@$host"
  else
    say "from your laptop, tunnel first: ssh -N -L $LAB_PORT:$host:$LAB_PORT $user@LOGIN-NODE"
    say "  (LOGIN-NODE: the host you ssh to; if that is $host itself, use localhost:$LAB_PORT instead of $host:$LAB_PORT)"
  fi
fi

if [ "$DRY_RUN" = 1 ]; then
  printf '%q ' "$JUPYTER" "${args[@]}"
  printf '\n'
  exit 0
fi
cd "$LAB_ROOT"
# JupyterLab's terminals (and `!` commands in cells) find the kit's harness, torchrun, horovodrun and
# deepspeed as in an activated environment.
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
exec "$JUPYTER" "${args[@]}"

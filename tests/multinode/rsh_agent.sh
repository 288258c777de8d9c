#!/usr/bin/env bash
# `ssh` for a namespace test cluster: OpenMPI's remote-shell agent (mpirun --mca plm_rsh_agent
# THIS) and, linked as `ssh` first on PATH, horovodrun's and DeepSpeed's ssh.
#
#   rsh_agent.sh [SSH OPTIONS] [USER@]NODE [SSH OPTIONS] COMMAND...
#
# As ssh does, the words of COMMAND are joined into one shell command line, run by sh on NODE
# (through enter_node.sh) with a fresh login-like environment: only what a real ssh session would
# have, so a launcher that forgets to forward a variable fails here as on a cluster.
# NETNS_CLUSTER_DIR names the cluster.
set -euo pipefail

skip_options() {
    # Sets `skipped` to the number of leading words that are ssh options and their values.
    skipped=0
    while [[ $# -gt 0 && "$1" == -* ]]; do
        case "$1" in
            # ssh options that take a value as the next word
            -b | -c | -D | -E | -e | -F | -I | -i | -J | -L | -l | -m | -O | -o | -p | -Q | -R | -S | -W | -w)
                shift 2
                skipped=$((skipped + 2)) ;;
            *)
                shift
                skipped=$((skipped + 1)) ;;
        esac
    done
}

skip_options "$@"
shift "$skipped"
if [[ $# -lt 1 ]]; then
    echo "rsh_agent.sh: usage: rsh_agent.sh [SSH OPTIONS] NODE [SSH OPTIONS] COMMAND..." >&2
    exit 255
fi
node="${1#*@}"
shift
# Like OpenSSH, take options after the destination too (horovodrun puts -o ConnectTimeout there).
skip_options "$@"
shift "$skipped"
if [[ $# -lt 1 ]]; then
    echo "rsh_agent.sh: no command for $node (this ssh runs commands only)" >&2
    exit 255
fi
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
exec "$here/enter_node.sh" "${NETNS_CLUSTER_DIR:?set NETNS_CLUSTER_DIR to the cluster directory}" "$node" \
    env -i HOME="${HOME:-/root}" PATH="$PATH" USER="${USER:-root}" LOGNAME="${LOGNAME:-root}" SHELL=/bin/sh \
    LANG="${LANG:-C.UTF-8}" NETNS_CLUSTER_DIR="$NETNS_CLUSTER_DIR" sh -c "$*"

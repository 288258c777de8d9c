#!/usr/bin/env bash
# Run a command on one node of a namespace test cluster (tests/multinode/netns_cluster.py): inside
# the node's network namespace, under the node's own hostname (a UTS namespace of its own) and with
# the cluster's hosts file over /etc/hosts (a mount namespace of its own, so nothing outside the
# command sees either change).
#
#   enter_node.sh CLUSTER_DIR NODE COMMAND [ARG...]
#
# CLUSTER_DIR/nodes/NODE holds the node's namespace name, CLUSTER_DIR/hosts every node's address.
# Both stages exec, so COMMAND keeps this script's process id (a test can signal it directly).
set -euo pipefail

if [[ "${1:-}" == "--inside" ]]; then
    # Second stage, already in the node's namespaces.
    hostname "$2"
    mount --bind "$3" /etc/hosts
    shift 3
    exec "$@"
fi

if [[ $# -lt 3 ]]; then
    echo "usage: enter_node.sh CLUSTER_DIR NODE COMMAND [ARG...]" >&2
    exit 2
fi
cluster_dir="$1"
node="$2"
shift 2
if [[ ! -f "$cluster_dir/nodes/$node" ]]; then
    echo "enter_node.sh: no node '$node' in the cluster at $cluster_dir" >&2
    exit 255  # what ssh returns when it cannot reach the host
fi
namespace="$(cat "$cluster_dir/nodes/$node")"
self="$(readlink -f "${BASH_SOURCE[0]}")"
# nsenter, not `ip netns exec`: that one also remounts /sys, which hides /sys/fs/cgroup (slurmd
# refuses to start without it). --propagation private: the hosts file's bind mount stays in here.
exec nsenter --net="/run/netns/$namespace" unshare --uts --mount --propagation private \
    "$self" --inside "$node" "$cluster_dir/hosts" "$@"

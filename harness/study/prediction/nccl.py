"""The time of one collective as NCCL would run it: the algorithm and protocol its tuner picks per
size and node count, from the latency and bandwidth terms of its published tuning model.

Facts taken from NVIDIA/nccl src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime; the
master branch of June 2026), written anew here:
- time (us) = latency + bytes / (1000 x algorithm bandwidth (GB/s)); the tuner takes the fastest
  enabled (algorithm, protocol);
- latency = base (per algorithm and protocol) + hardware latencies per step: a ring takes
  2(n-1) steps for allreduce and (n-1) for all-gather and reduce-scatter, 2(N-1) of them across
  the N nodes' network; a tree 2 x ((ranks per node - 1) x intra + log2(N) x inter) for allreduce;
  across nodes a ring's intra-node step costs at least the network post overhead (1 us on Intel,
  2 us on AMD CPUs, x3 with Simple); one rank per node takes the tree's network latency;
- bus bandwidth = channels x per-channel bandwidth (the node's own links on 1 node, the network's
  across more); LL halves it (at most llMaxBw), LL128 takes 92% (capped per channel); a tree's
  allreduce 92% (capped per channel), LL /3.8, LL128 120/128; algorithm bandwidth = bus x n/(2(n-1))
  for a ring allreduce, n/(n-1) for a ring all-gather or reduce-scatter, 0.5 for a tree;
- a tree's allreduce bandwidth is corrected per size (treeCorrectionFactor), and a multi-node ring
  allreduce with Simple pays 1.4x its latency (1.9x before Ampere) past 64 bytes per channel and rank.
Left out: CollNet (in-network reduction, SHARP switches), NVLS (NVSwitch multicast, Hopper and
later), PAT (one GPU per node only), the network plugin's own latency (taken as 0), user overrides
(NCCL_ALGO, NCCL_PROTO).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROTOCOLS = ("LL", "LL128", "Simple")
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")
# tuning.cc's constants in us, [LL, LL128, Simple].
BASE_LATENCY = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
HW_LATENCY = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
# GB/s; rows by GPU generation (one node) or CPU vendor (intel, amd: several), columns 1, 2, 3+ nodes.
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0)}
LL_MAX_BW["blackwell"] = tuple(2 * value for value in LL_MAX_BW["hopper"])
LL_MAX_BW_CPU = {"intel": LL_MAX_BW["volta"], "amd": LL_MAX_BW["ampere"]}
PER_CHANNEL_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
PER_CHANNEL_TREE_LL128 = {
    "volta": (20.0, 20.0, 20.0),
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
PER_CHANNEL_TREE = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0),
}
TREE_CORRECTION = (  # per protocol, by log2(bytes / 64) from 0 to 22
    (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
    ),
    (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
    ),
)
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
LIBRARY_NOTES = {
    "nccl": "NCCL's own tuning model",
    "rccl": "RCCL forks NCCL's tuner: the ring and tree structure (steps, log2 N) carries over; its "
    "constants for AMD GPUs differ and NCCL's are used here",
    "oneccl": "oneCCL picks among its own algorithms (ring, recursive doubling, ...): only the latency x steps "
    "+ bytes / bandwidth structure carries over; NCCL's constants and choices do not",
}


@dataclass(frozen=True)
class Choice:
    """One collective's predicted time and what the tuner picked for it."""

    seconds: float
    algorithm: str
    protocol: str


@dataclass(frozen=True)
class NcclModel:
    """A site's figures for NCCL's tuner: GB/s are bus bandwidths of one node (all channels)."""

    generation: str
    cpu_vendor: str
    intra_link: str  # nvlink or pci (xgmi, xelink: NVLink's latencies stand in)
    channels: int
    intra_gbytes_per_s: float
    inter_gbytes_per_s: float
    ll128_across_nodes: bool
    library: str = "nccl"

    @classmethod
    def from_profile(cls, network: Mapping[str, Any], tuner: Mapping[str, Any]) -> NcclModel:
        """From a site profile's `network` (bandwidths, NICs, efficiency) and `nccl` sections."""
        efficiency = network.get("efficiency", 1.0)
        return cls(
            generation=tuner["gpu_generation"],
            cpu_vendor=tuner["cpu_vendor"],
            intra_link=tuner.get("intra_link", "nvlink"),
            channels=int(tuner.get("channels", 8)),
            intra_gbytes_per_s=network["intra_node_gbytes_per_s"] * efficiency,
            inter_gbytes_per_s=network["nics_per_node"] * network["nic_gbytes_per_s"] * efficiency,
            ll128_across_nodes=bool(tuner.get("ll128_across_nodes", False)),
            library=tuner.get("library", "nccl"),
        )

    def seconds(self, kind: str, size: float, ranks: int, nodes: int) -> Choice:
        """The fastest (algorithm, protocol) for `kind` of `size` bytes (whole buffer) on `ranks`
        ranks over `nodes` nodes; a rank alone sends nothing."""
        if ranks < 2 or size <= 0:
            return Choice(0.0, "none", "-")
        options = [
            Choice(self._time_us(kind, algorithm, p, size, ranks, nodes) * 1e-6, algorithm, PROTOCOLS[p])
            for algorithm in (("ring", "tree") if kind == "all_reduce" else ("ring",))
            for p in range(3)
            if self._enabled(p, nodes)
        ]
        return min(options, key=lambda choice: choice.seconds)

    def _enabled(self, protocol: int, nodes: int) -> bool:
        # LL128 only where NCCL enables it by default: NVLink inside a node, and across nodes only
        # where the NIC is close to the GPU (tuning.cc: PXB before Hopper, PXN on Hopper and later).
        if PROTOCOLS[protocol] != "LL128":
            return True
        return self.intra_link == "nvlink" and (nodes == 1 or self.ll128_across_nodes)

    def _time_us(self, kind: str, algorithm: str, protocol: int, size: float, ranks: int, nodes: int) -> float:
        latency = self._latency(kind, algorithm, protocol, ranks, nodes)
        bandwidth = self._bandwidth(kind, algorithm, protocol, ranks, nodes)
        if algorithm == "tree":
            log_size = int(math.log2(max(size, 64) / 64))
            if log_size < len(TREE_CORRECTION[protocol]):
                bandwidth *= TREE_CORRECTION[protocol][log_size]
        plateau = size / (self.channels * ranks) >= 64
        if algorithm == "ring" and protocol == 2 and nodes > 1 and kind == "all_reduce" and plateau:
            latency *= 1.9 if self.generation == "volta" else 1.4
        return latency + size / (1000 * bandwidth)

    def _latency(self, kind: str, algorithm: str, protocol: int, ranks: int, nodes: int) -> float:
        intra = HW_LATENCY[self.intra_link if self.intra_link in HW_LATENCY else "nvlink"][algorithm][protocol]
        inter = HW_LATENCY["net"]["tree" if ranks == nodes else algorithm][protocol]
        base = BASE_LATENCY[algorithm][protocol]
        if algorithm == "tree":
            return base + 2 * ((ranks // nodes - 1) * intra + int(math.log2(nodes)) * inter)
        steps = 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1
        inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if kind == "all_reduce" else nodes - 1)
        if nodes > 1:  # an inter-node ring still posts every step to the network
            intra = max(intra, NET_OVERHEAD_US[self.cpu_vendor] * (3 if protocol == 2 else 1))
        return base + (steps - inter_steps) * intra + inter_steps * inter

    def _bandwidth(self, kind: str, algorithm: str, protocol: int, ranks: int, nodes: int) -> float:
        column = min(nodes, 3) - 1
        bus = self.intra_gbytes_per_s if nodes == 1 else min(self.intra_gbytes_per_s, self.inter_gbytes_per_s)
        ll_max = (LL_MAX_BW[self.generation] if nodes == 1 else LL_MAX_BW_CPU[self.cpu_vendor])[column]
        if algorithm == "ring":
            if protocol == 0:
                bus = min(ll_max, bus * 0.5)
            elif protocol == 1:
                bus = min(bus * 0.92, self.channels * PER_CHANNEL_RING_LL128[self.generation])
            steps = 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1
            return bus * ranks / steps
        bus = min(bus * 0.92, self.channels * PER_CHANNEL_TREE[self.generation][column])
        if protocol == 0:
            bus = min(bus / 3.8, ll_max)
        elif protocol == 1:
            bus = min(
                bus * (7 / 9 if nodes == 1 else 120 / 128),
                self.channels * PER_CHANNEL_TREE_LL128[self.generation][column],
            )
        return bus * 0.5


@dataclass(frozen=True)
class NcclNetwork:
    """A site's network as NCCL's tuner sees it, with the `harness predict` interface."""

    name: str
    ranks_per_node: int
    model: NcclModel
    source: str

    def seconds(self, kind: str, size: float, ranks: int, nodes: int) -> Choice:
        return self.model.seconds(kind, size, ranks, nodes)

    @property
    def alpha_intra_s(self) -> float:  # a ring's step on the node's links (Simple), for a bench's fit
        return HW_LATENCY.get(self.model.intra_link, HW_LATENCY["nvlink"])["ring"][2] * 1e-6

    @property
    def busbw_intra(self) -> float:
        return self.model.intra_gbytes_per_s * 1e9

    def assumptions(self) -> list[str]:
        """What this prediction takes for granted, one line each."""
        model = self.model
        return [
            f"collectives priced by NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc): {LIBRARY_NOTES[model.library]}",
            f"{model.generation} GPUs, {model.cpu_vendor} CPUs, {model.intra_link} inside a node, {model.channels} channels",
            f"bus bandwidth {model.intra_gbytes_per_s:g} GB/s inside a node, {model.inter_gbytes_per_s:g} GB/s "
            "across nodes (line rates x the profile's efficiency)",
            "LL128 across nodes " + ("on" if model.ll128_across_nodes else "off (the NIC is not next to the GPU)"),
            "left out: CollNet, NVLS, PAT; congestion and placement on the network; stragglers",
        ]

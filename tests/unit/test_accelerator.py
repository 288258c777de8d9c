"""The accelerator layer (harness.process.accelerator) on every kind it knows, with torch's answers
faked at the layer's boundary (torch.accelerator, torch.version.hip, the XCCL check), and the
refusals that follow from each backend's `devices` and `compiles`."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness.backends import BACKENDS, get_backend
from harness.backends.horovod import HorovodBackend
from harness.backends.single import SingleProcessBackend
from harness.backends.torch_distributed import process_group_backend
from harness.cli import main
from harness.config import TrainConfig
from harness.errors import EXIT_USAGE, UsageError
from harness.process import accelerator
from harness.process.accelerator import KINDS, detect_accelerator, kind_of, select_device
from harness.process.discovery import ClusterEnv
from harness.study.jobs.job import gpus_on_this_node
from harness.training.placement import check_config, check_device

# kind: (torch's device type, torch.version.hip, devices, device of local rank 3, communicator, variable)
KNOWN = {
    "cuda": ("cuda", None, 2, torch.device("cuda", 1), "nccl", "CUDA_VISIBLE_DEVICES"),
    "rocm": ("cuda", "6.2.0", 8, torch.device("cuda", 3), "nccl", "ROCR_VISIBLE_DEVICES"),
    "xpu": ("xpu", None, 4, torch.device("xpu", 3), "xccl", "ZE_AFFINITY_MASK"),
    "cpu": (None, None, 0, torch.device("cpu"), "gloo", None),
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    """fake(kind, xccl=True, oneccl=False): torch answers as on a node of that kind; returns the list
    of devices the layer made current."""
    current: list[torch.device] = []

    def install(kind: str, xccl: bool = True, oneccl: bool = False) -> list[torch.device]:
        device_type, hip, count, _, _, _ = KNOWN[kind]
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: device_type is not None)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device(device_type or "cuda"))
        monkeypatch.setattr(torch.accelerator, "device_count", lambda: count)
        monkeypatch.setattr(torch.accelerator, "set_device_index", current.append)
        monkeypatch.setattr(torch.version, "hip", hip)
        monkeypatch.setattr(dist, "is_xccl_available", lambda: xccl, raising=False)
        find_spec = accelerator.importlib.util.find_spec  # the one process-wide function: fake one name only
        monkeypatch.setattr(
            accelerator.importlib.util,
            "find_spec",
            lambda name, *rest: (
                (object() if oneccl else None) if name == accelerator.ONECCL_MODULE else find_spec(name, *rest)
            ),
        )
        return current

    return install


def _cluster(local_rank: int, local_size: int) -> ClusterEnv:
    return ClusterEnv(local_rank, local_size, local_rank, local_size, "127.0.0.1", 29500, "torchrun")


@pytest.mark.parametrize("kind", KINDS)
def test_kind_count_device_communicator_and_visibility_of_each_kind(fake, kind):
    _, _, count, device, group, variable = KNOWN[kind]
    fake(kind)
    found = detect_accelerator()
    assert (found.kind, found.count, found.communicator, found.visibility_variable) == (kind, count, group, variable)
    assert found.device(3) == device
    assert kind_of(device) == kind
    assert process_group_backend(device, 1) == group
    assert gpus_on_this_node() == count  # the job study counts devices through the layer, not a vendor tool


def test_a_rank_is_placed_on_its_device_and_made_current(fake):
    current = fake("rocm")
    assert select_device("auto", _cluster(5, 8)) == torch.device("cuda", 5)
    assert select_device("cuda", _cluster(5, 8), procs_per_gpu=2) == torch.device("cuda", 2)
    assert current == [torch.device("cuda", 5), torch.device("cuda", 2)]
    fake("cpu")
    assert select_device("auto", _cluster(5, 8)) == torch.device("cpu")


@pytest.mark.parametrize(
    "kind, requested, message",
    [
        ("cpu", "cuda", "--device cuda was asked for but no accelerator is available here; use --device cpu or auto"),
        ("cuda", "xpu", "--device xpu was asked for but this node has cuda here; use --device cpu or auto"),
    ],
)
def test_a_device_the_node_cannot_give_is_refused(fake, kind, requested, message):
    fake(kind)
    with pytest.raises(UsageError, match=message):
        select_device(requested, _cluster(0, 1))


def test_xpu_falls_back_to_oneccls_communicator_and_needs_one(fake):
    fake("xpu", xccl=False, oneccl=True)
    assert detect_accelerator().communicator == "ccl"
    fake("xpu", xccl=False, oneccl=False)
    with pytest.raises(
        UsageError, match="need a torch built with XCCL .* or oneccl_bindings_for_pytorch; install one"
    ):
        process_group_backend(torch.device("xpu", 0), 1)


def test_ranks_share_a_gpu_through_gloo_but_not_an_xpu(fake):
    fake("cuda")
    assert process_group_backend(torch.device("cuda", 0), 2) == "gloo"
    with pytest.raises(UsageError, match="gloo, which cannot reduce xpu tensors; use --procs-per-gpu 1"):
        process_group_backend(torch.device("xpu", 0), 2)


def test_every_backend_declares_known_device_kinds_and_runs_on_cpu():
    for cls in BACKENDS.values():
        assert set(cls.devices) <= set(KINDS) and "cpu" in cls.devices, cls.name


def test_a_backend_refuses_a_device_kind_naming_those_that_run_there():
    with pytest.raises(UsageError) as refused:
        check_device(HorovodBackend, torch.device("xpu", 0))
    message = str(refused.value)
    assert message.startswith("backend 'horovod' does not support xpu devices; use --backend ")
    assert "ddp" in message and "horovod or" not in message and "\n" not in message
    check_device(SingleProcessBackend, torch.device("xpu", 0))


def test_the_refusal_exits_2_before_training(fake, capsys):
    fake("xpu")
    assert main(["train", "--backend", "horovod", "--max-steps", "1"]) == EXIT_USAGE
    assert "does not support xpu devices" in capsys.readouterr().err


def test_compile_is_refused_where_a_backend_cannot_compile(monkeypatch):
    class NoCompile(SingleProcessBackend):
        name = "nocompile"
        compiles = False

    monkeypatch.setitem(BACKENDS, NoCompile.name, NoCompile)
    with pytest.raises(UsageError, match="backend 'nocompile' does not support --compile; use --backend none or"):
        check_config(TrainConfig(backend="nocompile", compile=True))
    check_config(TrainConfig(backend="nocompile"))
    with pytest.raises(UsageError, match="--timing-warmup-steps 1 or more"):
        check_config(TrainConfig(compile=True, timing_warmup_steps=0))


def test_compile_compiles_the_wrapped_model_and_says_so(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model: ("compiled", model))  # importing dynamo takes 10 s
    backend, model = get_backend("none"), torch.nn.Linear(2, 2)
    assert backend.compiled is None
    assert backend.compile(model) == ("compiled", model) and backend.compiled == "torch.compile(Linear)"

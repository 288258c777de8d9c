"""Site profiles as data, and what a job takes from them: the launcher's words, GPU affinity, the
network variables (NCCL_NET required on Polaris), a short TMPDIR, and the rendezvous on the
high-speed network; discovery reads the step's node list, not the job's."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal

import pytest

from harness.errors import EXIT_PREEMPTED, UsageError
from harness.process.discovery import RENDEZVOUS_DOMAIN_VARIABLE, detect_cluster
from harness.study.jobs import continuation
from harness.study.jobs.job import apply_site_environment
from harness.study.jobs.scheduler import parse_scontrol_json
from harness.study.jobs.settings import site_launch
from harness.study.sites import load_site, profile_from_dict, site_names
from tests.conftest import REPO
from tests.helpers.study_helpers import make_job


def test_the_kit_brings_its_sites():
    assert {"polaris", "perlmutter", "aurora", "frontier", "generic-slurm", "generic-pbs"} <= set(site_names())
    for name in site_names():
        profile = load_site(name)
        assert profile.name == name and profile.scheduler in ("pbs", "slurm") and "{ranks}" in profile.launch
        assert not set(profile.backends) & set(profile.unsupported_backends), name
        assert set(profile.unsupported_backends) <= set(profile.backend_notes), f"{name}: say what to use instead"


@pytest.mark.parametrize("name", [name for name in site_names() if load_site(name).gpus_per_node])
def test_every_gpu_site_launches_one_rank_per_gpu_with_every_placeholder_filled(name, tmp_path):
    profile = load_site(name)
    job = make_job(name, str(tmp_path / "job"), gpus=profile.gpus_per_node)
    launch = site_launch(job.profile, job.settings, "/kit")
    assert job.settings.ranks_per_node == profile.gpus_per_node
    left = set(re.findall(r"\{(\w+)\}", launch))
    assert left == {"ranks", "ppn"} | ({"nodes"} if profile.scheduler == "slurm" else set()), launch
    if profile.cores_per_node:  # each rank's cores within the node's
        assert job.settings.depth * profile.gpus_per_node <= profile.cores_per_node


def test_polaris_leaves_horovod_out_and_says_why():
    polaris = load_site("polaris")
    assert "horovod" not in polaris.backends and "ddp" in polaris.backends
    note = polaris.backend_notes["horovod"]
    assert "no Horovod since 2025-10" in note and "PYTHON_ENV=venv" in note and "tools/layered_venv.sh" in note
    assert polaris.backend_requirements["horovod"] == {"mpi": True, "nccl": True}


def test_queues_with_limits_routing_and_chaining():
    polaris, perlmutter = load_site("polaris"), load_site("perlmutter")
    assert polaris.execution_queue("prod", 12).name == "small" and polaris.execution_queue("prod", 300).name == "large"
    assert polaris.queue("debug-scaling").max_walltime_s == 3600 and not polaris.queue("debug-scaling").chaining
    assert not perlmutter.queue("debug").chaining and perlmutter.queue("regular").max_walltime_s == 2 * 86400
    assert perlmutter.queue("preempt").preempt == "requeue"
    with pytest.raises(UsageError, match="routes jobs of 3 node"):
        polaris.execution_queue("prod", 3)
    with pytest.raises(UsageError, match="unknown polaris queue 'prdo'"):
        polaris.queue("prdo")


def test_a_profile_with_a_typo_is_refused_naming_the_field(tmp_path):
    data = json.load(open(os.path.join(REPO, "harness", "study", "sites", "generic-slurm.json")))
    with pytest.raises(UsageError, match="scheduler 'lsf'"):
        profile_from_dict({**data, "scheduler": "lsf"}, "x.json")
    with pytest.raises(UsageError, match="gpu_count"):
        profile_from_dict({**data, "gpu_count": 4}, "x.json")
    path = tmp_path / "mysite.json"
    path.write_text(json.dumps({**data, "name": "mysite"}))
    assert load_site(str(path)).name == "mysite"


def test_polaris_launches_with_depth_binding_and_the_affinity_helper(tmp_path):
    job = make_job("polaris", str(tmp_path / "job"), gpus=4)
    assert site_launch(job.profile, job.settings, "/kit") == (
        "mpiexec -n {ranks} --ppn {ppn} --depth 8 --cpu-bind depth --env OMP_NUM_THREADS=8 "
        "/kit/submissions/set_affinity_gpu_polaris.sh"
    )
    shared = make_job("polaris", str(tmp_path / "mps"), {"PROCS_PER_GPU": "2"}, gpus=4)
    assert shared.settings.ranks_per_node == 8 and shared.settings.depth == 4
    assert shared.profile.mps_command("start", {"nodes": 2, "kit": "/kit"}) == [
        "mpiexec",
        "-n",
        "2",
        "--ppn",
        "1",
        "/kit/submissions/mps.sh",
        "start",
    ]


def test_perlmutter_launches_srun_with_gpus_in_reverse_order(tmp_path):
    job = make_job("perlmutter", str(tmp_path / "job"), gpus=4)
    assert site_launch(job.profile, job.settings, "/kit") == (
        "srun --nodes {nodes} --ntasks {ranks} --ntasks-per-node {ppn} --cpus-per-task 16 --cpu-bind cores "
        "--gpus-per-node 4 env CUDA_VISIBLE_DEVICES=3,2,1,0"
    )
    cpu = make_job(
        "perlmutter", str(tmp_path / "cpu"), {"GPUS_PER_NODE": "0", "RANKS_PER_NODE": "2", "SRUN_MPI": "pmix"}
    )
    assert site_launch(cpu.profile, cpu.settings, "/kit").endswith("--cpu-bind cores --mpi pmix")


def test_a_gpu_site_without_gpus_asks_for_a_cpu_layout(tmp_path):
    with pytest.raises(UsageError, match="RANKS_PER_NODE=N and GPUS_PER_NODE=0"):
        make_job("perlmutter", str(tmp_path / "job"), gpus=0)


def test_polaris_sets_nccl_net_always_a_short_tmpdir_and_the_hsn_domain(tmp_path):
    # NCCL_NET names the plugin even where its directory is not found: NCCL then fails loudly
    # instead of falling back to TCP sockets. The job's long TMPDIR is replaced (MPS sockets).
    job = make_job("polaris", str(tmp_path / "job"), gpus=4)
    environ = {
        "TMPDIR": "/local/scratch/pbs.3214567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
        "NCCL_CROSS_NIC": "0",
    }
    apply_site_environment(job, environ)
    assert environ["NCCL_NET"] == "AWS Libfabric" and environ["TMPDIR"] == "/tmp"
    assert environ["NCCL_CROSS_NIC"] == "0"  # a tuning value the user set wins over the site's default
    assert (environ["FI_MR_CACHE_MONITOR"], environ["FI_CXI_DEFAULT_CQ_SIZE"], environ["NCCL_NET_GDR_LEVEL"]) == (
        "userfaultfd",
        "131072",
        "PHB",
    )
    assert environ["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/mps-123/pipe"
    assert environ[RENDEZVOUS_DOMAIN_VARIABLE] == "hsn.cm.polaris.alcf.anl.gov"
    assert environ["GPUS_PER_NODE"] == "4"
    off = make_job("polaris", str(tmp_path / "off"), {"RENDEZVOUS_DOMAIN": ""}, gpus=4)
    apply_site_environment(off, quiet := {})
    assert RENDEZVOUS_DOMAIN_VARIABLE not in quiet


def test_rank_zero_is_reached_on_the_high_speed_network():
    pals = {
        "PMI_RANK": "5",
        "PMI_SIZE": "8",
        "PMI_LOCAL_RANK": "1",
        "PMI_LOCAL_SIZE": "4",
        RENDEZVOUS_DOMAIN_VARIABLE: "hsn.cm.polaris.alcf.anl.gov",
    }
    assert (
        detect_cluster(pals, mpi_hostname=lambda: "x3005c0s7b0n0").master_addr
        == "x3005c0s7b0n0.hsn.cm.polaris.alcf.anl.gov"
    )
    qualified = detect_cluster(pals, mpi_hostname=lambda: "x3005c0s7b0n0.cm.polaris.alcf.anl.gov").master_addr
    assert qualified == "x3005c0s7b0n0.hsn.cm.polaris.alcf.anl.gov"
    plain = {k: v for k, v in pals.items() if k != RENDEZVOUS_DOMAIN_VARIABLE}
    assert detect_cluster(plain, mpi_hostname=lambda: "x3005c0s7b0n0").master_addr == "x3005c0s7b0n0"


def test_aurora_sets_the_oneccl_environment_alcf_recommends_and_the_hsn_domain(tmp_path):
    job = make_job("aurora", str(tmp_path / "job"), gpus=12)
    environ = {"CCL_KVS_MODE": "pmi"}
    apply_site_environment(job, environ)
    assert (environ["CCL_PROCESS_LAUNCHER"], environ["CCL_ATL_TRANSPORT"], environ["FI_MR_CACHE_MONITOR"]) == (
        "pmix",
        "mpi",
        "userfaultfd",
    )
    assert environ["CCL_KVS_MODE"] == "pmi"  # a tuning value the user set wins over the site's default
    assert environ[RENDEZVOUS_DOMAIN_VARIABLE] == "hsn.cm.aurora.alcf.anl.gov"


def test_aurora_and_frontier_queues_route_by_node_count():
    aurora, frontier = load_site("aurora"), load_site("frontier")
    assert aurora.execution_queue("prod", 256).name == "small" and aurora.execution_queue("prod", 2000).name == "large"
    assert aurora.queue("debug-scaling").min_nodes == 2 and not aurora.queue("debug").chaining
    assert [frontier.execution_queue("batch", n).name for n in (1, 91, 92, 184, 1882, 5645)] == [
        "batch-bin5",
        "batch-bin5",
        "batch-bin4",
        "batch-bin3",
        "batch-bin2",
        "batch-bin1",
    ]
    assert [frontier.execution_queue("batch", n).max_walltime_s // 3600 for n in (91, 183, 9472)] == [2, 6, 12]
    assert frontier.queue("extended").max_walltime_s == 86400 and frontier.queue("extended").max_nodes == 64
    with pytest.raises(UsageError, match="routes jobs of 9473 node"):
        frontier.execution_queue("batch", 9473)


def test_frontier_lists_its_debug_qos_beside_its_partitions():
    frontier, perlmutter = load_site("frontier"), load_site("perlmutter")
    debug = frontier.qos_limits("debug")
    assert (debug.max_walltime_s, debug.chaining, debug.max_running_jobs) == (7200, False, 1)
    assert frontier.qos_limits(None) is None and "debug" not in frontier.queues
    with pytest.raises(UsageError, match="unknown frontier QOS 'dbug'; choose one of debug"):
        frontier.qos_limits("dbug")
    assert perlmutter.qos == {} and perlmutter.qos_limits("debug") is None  # its queues are the QOSes


@pytest.mark.parametrize(
    "change, error",
    [
        ({"qos": ["debug"]}, '"qos" must map each name to an object of its limits'),
        ({"qos": {"debug": "02:00:00"}}, '"qos" must map each name to an object of its limits'),
        ({"qos": {"debug": {"max_wall": "02:00:00"}}}, "qos debug: .*max_wall"),
        ({"qos": {"debug": {"max_walltime": "2h"}}}, "qos debug: walltime '2h' is not a slurm time limit"),
        ({"qos": {"debug": {"chaining": "no"}}}, "qos debug: chaining 'no' is not true or false"),
        ({"qos": {"debug": {"max_running_jobs": True}}}, "qos debug: max_running_jobs True is not a whole number"),
        (
            {"qos": {"debug": {"routes_to": ["batch"]}}},
            "qos debug: routes_to, execution_only and preempt are partition",
        ),
        ({"queue_field": "qos"}, '"qos" describes the QOSes of a Slurm site whose queues are partitions'),
    ],
)
def test_a_malformed_qos_table_is_refused_naming_what_is_wrong(change, error):
    data = json.load(open(os.path.join(REPO, "harness", "study", "sites", "frontier.json")))
    with pytest.raises(UsageError, match=f"site profile x.json: {error}"):
        profile_from_dict({**data, **change}, "x.json")


def test_frontier_binds_each_rank_to_its_closest_gcd_and_sets_the_rccl_plugin_environment(tmp_path):
    # OLCF Frontier user guide: 8 ranks per node, 7 cores each (56 usable), --gpus-per-task=1
    # --gpu-bind=closest; the RCCL/libfabric variables HPE and AMD recommend with the plugin.
    job = make_job("frontier", str(tmp_path / "job"), gpus=8)
    assert site_launch(job.profile, job.settings, "/kit") == (
        "srun --network=disable_rdzv_get --nodes {nodes} --ntasks {ranks} --ntasks-per-node {ppn} "
        "--cpus-per-task 7 --gpus-per-task 1 --gpu-bind closest"
    )
    environ = {}
    apply_site_environment(job, environ)
    assert (environ["NCCL_NET_GDR_LEVEL"], environ["NCCL_CROSS_NIC"], environ["FI_MR_CACHE_MONITOR"]) == (
        "PHB",
        "1",
        "kdreg2",
    )
    assert "NCCL_NET" not in environ  # the plugin does not start in one-node jobs: forcing it would fail them


def test_a_profile_with_a_bad_socket_range_is_refused_naming_it():
    data = json.load(open(os.path.join(REPO, "harness", "study", "sites", "aurora.json")))
    with pytest.raises(UsageError, match="cpu_sockets entry '53-' is not a core range"):
        profile_from_dict({**data, "cpu_sockets": ["1-51", "53-"]}, "x.json")


def _perlmutter_gpu_job(tmp_path, fixture: str, qos: str, **values: str):
    """A Perlmutter GPU job as its record shows it: submitted with -q QOS -C gpu, its QOS gpu_QOS
    (`sacctmgr show qos` names gpu_debug, gpu_regular, gpu_shared: doe-iri/iri-facility-api-python#49)."""
    with open(os.path.join(REPO, "tests", "data", fixture)) as handle:
        record = parse_scontrol_json(handle.read(), "qos")
    record = dataclasses.replace(record, queue=f"gpu_{qos}", options={**record.options, "qos": f"gpu_{qos}"})
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n")
    return make_job("perlmutter", str(tmp_path / "job"), values, record=record, gpus=4, script=str(script))


def test_perlmutters_default_study_asks_only_for_what_nerscs_pytorch_module_has():
    profile = load_site("perlmutter")
    assert profile.backends == ("ddp", "fsdp")
    assert {"horovod", "deepspeed"} <= set(profile.backend_notes)  # how to add each, in a layered venv
    with open(os.path.join(REPO, "submissions", "perlmutter.sbatch")) as handle:
        examples = [line for line in handle if 'BACKENDS="' in line]
    assert examples and not any("horovod" in line for line in examples)  # the template's own example


def test_job_records_name_perlmutters_qos_by_alias_and_are_judged_and_resubmitted_by_name(
    tmp_path, monkeypatch, capsys
):
    profile = load_site("perlmutter")
    assert [profile.queue(f"gpu_{name}").name for name in ("debug", "regular", "preempt")] == [
        "debug",
        "regular",
        "preempt",
    ]
    assert profile.unlisted_queue("gpu_shared") is not None and profile.submit_name("gpu_regular") == "regular"
    cut_short = []
    monkeypatch.setattr(continuation, "resubmit", lambda job, queue: cut_short.append(queue) or "77")
    monkeypatch.setattr(continuation, "_cause", lambda job: "preempted")
    # a debug study cut short does not chain itself: NERSC forbids it
    debug = _perlmutter_gpu_job(tmp_path / "debug", "scontrol_perlmutter_debug.json", "debug")
    assert continuation.continue_study(debug, signal.SIGUSR1) == EXIT_PREEMPTED and cut_short == []
    assert (
        "not resubmitting (queue debug allows no job chaining (NERSC allows no job chaining" in capsys.readouterr().out
    )
    # the preempt QOS's rule: Slurm requeues a preempted job submitted with --requeue itself
    preempted = _perlmutter_gpu_job(tmp_path / "preempt", "scontrol_perlmutter_preempted.json", "preempt")
    assert continuation.continue_study(preempted, signal.SIGTERM) == 0 and cut_short == []
    assert preempted.events() == ["preempted: requeued by the scheduler"]
    # a regular study continues, asking for -q regular (and --requeue only where the QOS requeues)
    regular = _perlmutter_gpu_job(tmp_path / "regular", "scontrol_perlmutter_regular.json", "regular")
    command, _, _ = continuation._submission(regular, profile.queue("gpu_regular"))
    assert command[command.index("--qos") + 1] == "regular" and "--requeue" not in command
    command, _, _ = continuation._submission(regular, profile.queue("gpu_preempt"))
    assert "--requeue" in command


def test_an_alias_means_one_queue_only():
    data = json.loads(open(os.path.join(REPO, "harness", "study", "sites", "perlmutter.json")).read())
    data["queues"]["premium"]["aliases"] = ["gpu_regular"]
    with pytest.raises(UsageError, match="premium's alias gpu_regular is also regular's name or alias"):
        profile_from_dict(data, "twice.json")
    data["queues"]["premium"]["aliases"] = "gpu_premium"
    with pytest.raises(UsageError, match="queue premium: aliases 'gpu_premium' is not a list of names"):
        profile_from_dict(data, "string.json")


def test_polaris_accepts_its_demand_queue_and_knows_its_backfill_queues():
    # ALCF user guide, docs/polaris/running-jobs/index.md: demand, 1-56 nodes, 1 hour, by request;
    # prod routes to small/medium/large and, for a project with a negative balance, backfill-*.
    profile = load_site("polaris")
    demand = profile.queue("demand")
    assert (demand.min_nodes, demand.max_nodes, demand.max_walltime_s) == (1, 56, 3600)
    assert profile.execution_queue("prod", 30).name == "medium"
    assert profile.queue("backfill-medium").execution_only and profile.submit_queue("backfill-medium") == "prod"

"""Site profiles read against the sites' guides: every pinned version and site fact carries its source,
NCCL_NET is set only with its plugin, the plugin is found (or named in one line) before any run, and
a site that needs mpi4py before torch says so to every rank."""

from __future__ import annotations

import os
import re

import pytest

from harness.errors import UsageError
from harness.process.imports import IMPORT_FIRST_VARIABLE, import_first
from harness.study.jobs.job import apply_site_environment
from harness.study.jobs.network import apply_network_plugin, check_network_plugin, plugin_choice
from harness.study.jobs.preflight import check_study
from harness.study.sites import load_site, site_names
from tests.conftest import REPO
from tests.helpers.study_helpers import make_job

pytestmark = pytest.mark.timeout(120)

PLUGINS = os.path.join(REPO, "tests", "data", "site_plugins")
POLARIS = os.path.join(REPO, "submissions", "polaris.sc")
AURORA = os.path.join(REPO, "submissions", "aurora.sc")
PLUGIN_VARIABLES = ("NCCL_NET_GDR_LEVEL", "NCCL_CROSS_NIC", "NCCL_COLLNET_ENABLE", "NCCL_NET")


@pytest.mark.parametrize("site", site_names())
def test_every_profile_says_when_it_was_verified_and_where_each_fact_comes_from(site):
    profile = load_site(site)
    assert profile.verified_on == "not run there" or re.fullmatch(r"\d{4}-\d{2}-\d{2}", profile.verified_on)
    for what, pin in profile.pins.items():
        assert pin.get("value") and len(pin.get("source", "")) > 20, f"{site}: pin {what} needs a value and a source"
    if profile.network_plugin is not None:
        assert profile.network_plugin.library and profile.network_plugin.fix and profile.network_plugin.source
    if profile.import_first:
        assert {"module", "reason", "source"} <= set(profile.import_first) and all(profile.import_first.values())
    assert all(queue.source for queue in profile.unlisted_queues)


@pytest.mark.parametrize("site", site_names())
def test_nccl_net_is_set_only_together_with_its_plugin(site):
    profile = load_site(site)
    assert "NCCL_NET" not in {**profile.environment, **profile.environment_defaults}
    if profile.network_plugin is None:
        return
    job = make_job(site, "/tmp/unused-job-dir-of-a-site-test", gpus=profile.gpus_per_node)
    environ = {"LD_LIBRARY_PATH": "/opt/site/lib"}
    apply_site_environment(job, environ)
    first = environ["LD_LIBRARY_PATH"].split(":")
    assert first[: len(profile.network_plugin.library_path)] == list(profile.network_plugin.library_path)
    assert "/opt/site/lib" in first


def test_polaris_names_the_plugin_and_hwloc_directories_as_alcf_documents_them():
    plugin = load_site("polaris").network_plugin
    assert plugin.library_path == ("/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib", "/soft/libraries/hwloc/lib")
    assert plugin.variables["NCCL_NET"] == "AWS Libfabric"
    assert "docs/polaris/applications-and-libraries/libraries/nccl.md" in plugin.source


@pytest.mark.parametrize("site", [name for name in site_names() if load_site(name).network_plugin])
def test_a_missing_plugin_is_one_line_naming_the_fix_and_off_turns_it_away(site):
    profile = load_site(site)
    [line] = check_network_plugin(profile, "on", profile.gpus_per_node, {"LD_LIBRARY_PATH": "/nowhere"})
    assert profile.network_plugin.library in line and "NCCL_NET_PLUGIN=off" in line and "\n" not in line
    assert check_network_plugin(profile, "on", profile.gpus_per_node, {"LD_LIBRARY_PATH": PLUGINS}) == []
    assert check_network_plugin(profile, "off", profile.gpus_per_node, {}) == []
    assert check_network_plugin(profile, "on", 0, {}) == []  # CPU runs load no NCCL plugin


def test_off_unsets_what_alcf_says_to_unset_where_deepspeed_hangs(tmp_path):
    job = make_job("polaris", str(tmp_path / "job"), {"NCCL_NET_PLUGIN": "off"}, gpus=4)
    environ = {"NCCL_NET": "AWS Libfabric", "NCCL_CROSS_NIC": "1"}  # as a conda module may have set them
    apply_site_environment(job, environ)
    assert not set(PLUGIN_VARIABLES) & set(environ)
    with pytest.raises(UsageError, match="NCCL_NET_PLUGIN=maybe: choose on"):
        plugin_choice("maybe")


def test_polaris_check_refuses_a_node_without_the_plugin_and_passes_with_it_or_with_off():
    def check(environ, *settings):
        words = ["-A", "p", "-v", ",".join(["BACKENDS=ddp", *settings])]
        return check_study("polaris", POLARIS, words, environ=environ)[0]

    refused = check({})
    assert len(refused.problems) == 1 and "libnccl-net.so" in refused.problems[0]
    assert check({"LD_LIBRARY_PATH": PLUGINS}).ok
    assert check({}, "NCCL_NET_PLUGIN=off").ok


def test_apply_keeps_the_users_tuning_values():
    profile = load_site("polaris")
    environ = {"NCCL_CROSS_NIC": "0"}
    apply_network_plugin(profile, "on", environ)
    assert environ["NCCL_CROSS_NIC"] == "0" and environ["NCCL_NET"] == "AWS Libfabric"


def test_polaris_ranks_import_mpi4py_before_torch_and_other_sites_do_not(tmp_path):
    polaris = make_job("polaris", str(tmp_path / "p"), gpus=4)
    environ: dict = {}
    apply_site_environment(polaris, environ)
    assert environ[IMPORT_FIRST_VARIABLE] == "mpi4py.MPI"
    assert "GTL library is not linked" in polaris.profile.import_first["reason"]
    perlmutter = make_job("perlmutter", str(tmp_path / "q"), gpus=4)
    apply_site_environment(perlmutter, other := {})
    assert IMPORT_FIRST_VARIABLE not in other


def test_import_first_imports_in_order_and_names_a_missing_module():
    assert import_first({IMPORT_FIRST_VARIABLE: "json, colorsys"}) == ["json", "colorsys"]
    with pytest.raises(UsageError, match="asks for no_such_module_here before torch, needs no_such_module_here"):
        import_first({IMPORT_FIRST_VARIABLE: "no_such_module_here"})


def test_aurora_refuses_qsub_capital_v_and_polaris_does_not():
    words = ["-A", "p", "-V", "-v", "BACKENDS=ddp"]
    refused = check_study("aurora", AURORA, words, environ={})[0]
    [line] = [line for line in refused.problems if line.startswith("-V:")]
    assert "use -v" in line.replace("pass the variables the job needs with -v", "use -v") and "known-issues.md" in line
    polaris = check_study("polaris", POLARIS, words, environ={"LD_LIBRARY_PATH": PLUGINS})[0]
    assert not any(line.startswith("-V") for line in polaris.problems)


def test_frontier_and_aurora_pin_their_guides_versions():
    frontier = load_site("frontier")
    rocm = frontier.pins["rocm"]["value"]
    index = frontier.pins["wheel index"]["value"]
    assert rocm.startswith("rocm/") and index.endswith("rocm" + ".".join(rocm.split("/")[1].split(".")[:2]))
    assert "--network=disable_rdzv_get" in frontier.launch
    aurora = load_site("aurora")
    assert re.fullmatch(r"frameworks/\d{4}\.\d+\.\d+", aurora.pins["frameworks"]["value"])
    assert aurora.environment["TMPDIR"] == "/tmp"


@pytest.mark.parametrize(
    "template, pinned",
    [("aurora.sc", ["frameworks"]), ("frontier.sbatch", ["rocm"])],  # the wheel index: tools/setup_frontier.sh
)
def test_the_templates_load_what_the_profiles_pin(template, pinned):
    text = open(os.path.join(REPO, "submissions", template)).read()
    profile = load_site(template.split(".")[0])
    for what in pinned:
        assert profile.pins[what]["value"] in text, f"{template} does not use {what} {profile.pins[what]['value']}"


def test_a_qsub_from_outside_the_kit_that_names_no_kit_fails_the_check(tmp_path):
    # The job looks for the kit in KIT_DIR, else where it was submitted from (PBS_O_WORKDIR): from
    # elsewhere, without -v KIT_DIR, it exits 2 at its start; --check says so before the queue.
    words = ["-A", "p", "-v", "BACKENDS=ddp"]
    plugins = {"LD_LIBRARY_PATH": PLUGINS}
    outside = check_study("polaris", POLARIS, words, environ=plugins, submit_dir=str(tmp_path))[0]
    assert outside.problems == [
        f"qsub from {tmp_path} starts the job there, not in the kit, and the job would exit 2; cd {REPO} "
        f"before qsub, or pass -v KIT_DIR={REPO}"
    ]
    named = ["-A", "p", "-v", f"BACKENDS=ddp,KIT_DIR={REPO}"]
    assert check_study("polaris", POLARIS, named, environ=plugins, submit_dir=str(tmp_path))[0].ok
    assert check_study("polaris", POLARIS, words, environ=plugins, submit_dir=REPO)[0].ok


def test_polaris_warns_of_job_data_in_home_as_alcf_discourages_it(tmp_path):
    # ALCF user guide, docs/data-management/filesystem-and-storage/index.md: home (50 GB quota) is for
    # small files; intensive I/O from compute nodes belongs on the project file systems (Eagle).
    words = ["-A", "p", "-v", "BACKENDS=ddp,JOB_DIR=/home/jdoe/runs/study"]
    result = check_study("polaris", POLARIS, words, environ={"LD_LIBRARY_PATH": PLUGINS})[0]
    assert result.ok and any("/lus/eagle/projects/<project>" in line for line in result.warnings), result


def test_frontiers_setup_script_installs_what_the_profile_pins():
    text = open(os.path.join(REPO, "tools", "setup_frontier.sh")).read()
    profile = load_site("frontier")
    for what in ("programming environment", "rocm", "wheel index", "torch", "mpi4py"):
        for word in profile.pins[what]["value"].split():
            assert word.strip('"') in text, f"setup_frontier.sh lacks {what}'s {word}"
    assert "miniforge3/23.11.0-0" in text and "python=3.12" in text and "deepspeed" in text.lower()
    assert (
        "deepspeed" in profile.backends
        and "setup_frontier.sh" in open(os.path.join(REPO, "submissions", "frontier.sbatch")).read()
    )

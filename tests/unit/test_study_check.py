"""`harness study --check` before anything is queued: each problem one line naming its fix, exit 2.

The request is the template's directives with the command line over them, as qsub/sbatch read it.
Horovod missing from Polaris' conda is refused by the check run through the template itself, and
nothing is submitted."""

from __future__ import annotations

import json
import os
import re

import pytest

from harness.errors import UsageError
from harness.study.jobs.job import apply_site_environment, in_job_checks
from harness.study.jobs.preflight import check_study
from harness.study.jobs.scheduler import JobRecord
from harness.study.jobs.settings import sweep_settings
from harness.study.jobs.submit import parse_pbs_variables, parse_submission
from tests.conftest import REPO
from tests.helpers.study_helpers import make_job

POLARIS = os.path.join(REPO, "submissions", "polaris.sc")
PERLMUTTER = os.path.join(REPO, "submissions", "perlmutter.sbatch")
AURORA = os.path.join(REPO, "submissions", "aurora.sc")
FRONTIER = os.path.join(REPO, "submissions", "frontier.sbatch")
PLUGINS = {"LD_LIBRARY_PATH": os.path.join(REPO, "tests", "data", "site_plugins")}  # the sites' NCCL/RCCL plugins


def polaris(*args: str, **variables: str):
    """check_study of qsub ARGS polaris.sc, the -v list from `variables` (ddp only: quick imports)."""
    settings = {"BACKENDS": "ddp", **variables}
    return check_study(
        "polaris", POLARIS, [*args, "-v", ",".join(f"{k}={v}" for k, v in settings.items())], environ=PLUGINS
    )[0]


def perlmutter(*args: str, environ=None):
    return check_study(
        "perlmutter", PERLMUTTER, list(args), environ={"BACKENDS": "ddp", **PLUGINS, **(environ or {})}
    )[0]


def test_the_templates_own_request_passes_once_the_account_is_given():
    result = polaris("-A", "DLscaling")
    assert result.ok and result.warnings == [], result
    assert polaris().problems == ["no account: polaris charges every job to one; pass -A <project>"]


@pytest.mark.parametrize(
    "args, problem",
    [
        (["-q", "debug", "-l", "select=4:system=polaris"], "queue debug takes 1-2 nodes, not 4"),
        (
            ["-q", "debug-scaling", "-l", "walltime=02:00:00"],
            "walltime 02:00:00 exceeds queue debug-scaling's 01:00:00",
        ),
        (["-q", "small", "-l", "select=12:system=polaris"], "queue small takes no submissions; submit to prod"),
        (["-q", "prod", "-l", "select=4:system=polaris"], "queue prod routes jobs of 4 node(s) nowhere"),
        (
            ["-q", "prod", "-l", "select=30:system=polaris", "-l", "walltime=12:00:00"],
            "walltime 12:00:00 exceeds queue medium's 06:00:00",
        ),
        (["-q", "prdo"], "unknown polaris queue 'prdo'; choose one of debug, debug-scaling, prod, capacity"),
    ],
)
def test_polaris_queues_refuse_what_they_do_not_take(args, problem):
    result = polaris("-A", "DLscaling", *args)
    assert any(line.startswith(problem) for line in result.problems), result.problems


def test_a_routing_queue_with_a_size_it_routes_passes():
    assert polaris("-A", "DLscaling", "-q", "prod", "-l", "select=12:system=polaris", "-l", "walltime=03:00:00").ok


def test_job_data_must_be_on_a_file_system_the_job_asks_for():
    result = polaris("-A", "DLscaling", JOB_DIR="/lus/grand/projects/DLscaling/study")
    assert result.problems == [
        "JOB_DIR=/lus/grand/projects/DLscaling/study is on grand, which -l filesystems=home:eagle "
        "does not name; pass -l filesystems=home:eagle:grand"
    ]
    assert polaris("-A", "DLscaling", "-l", "filesystems=home:grand", JOB_DIR="/lus/grand/projects/DLscaling/study").ok


def test_perlmutter_warns_about_job_data_in_home(tmp_path):
    home = tmp_path / "home"
    result = perlmutter("-A", "m4321", environ={"HOME": str(home), "JOB_DIR": str(home / "study")})
    assert result.ok and result.warnings == [
        f"JOB_DIR={home / 'study'}: $HOME has a 40 GB quota and is not meant for job data; set JOB_DIR under $SCRATCH"
    ]
    scratch = perlmutter(
        "-A",
        "m4321",
        environ={
            "HOME": str(home),
            "SCRATCH": str(tmp_path / "scratch"),
            "JOB_DIR": str(tmp_path / "scratch" / "study"),
        },
    )
    assert scratch.ok and scratch.warnings == []


def test_chaining_is_refused_up_front_in_the_debug_qos():
    result = perlmutter("-A", "m4321", "-q", "debug", "-N", "1", "-t", "30:00", environ={"RESUBMIT": "1"})
    assert result.problems == [
        "RESUBMIT=1, but queue debug allows no job chaining (NERSC allows no job chaining in "
        "the debug QOS); submit with RESUBMIT=0 (or auto), or to another queue"
    ]
    warned = perlmutter("-A", "m4321", "-q", "debug", "-N", "1", "-t", "30:00")
    assert warned.ok and warned.warnings[0].startswith("queue debug allows no job chaining")
    assert perlmutter("-A", "m4321", "-q", "debug", "-N", "1", "-t", "30:00", environ={"RESUBMIT": "0"}).warnings == []
    assert perlmutter("-A", "m4321", "-q", "debug", "-N", "1", "-t", "1:00:00").problems == [
        "walltime 01:00:00 exceeds queue debug's 00:30:00; ask for at most 00:30:00"
    ]


def test_a_dataset_read_from_files_must_be_there(tmp_path):
    assert (
        polaris("-A", "p", DATASET="cifar10")
        .problems[0]
        .startswith("DATASET=cifar10 is read from files: pass DATA_DIR=<directory>")
    )
    empty = tmp_path / "data"
    empty.mkdir()
    assert (
        polaris("-A", "p", DATASET="cifar10", DATA_DIR=str(empty))
        .problems[0]
        .startswith(f"DATA_DIR={empty} holds no cifar10: `harness data download cifar10 --data-dir {empty}`")
    )


def test_bad_settings_and_bad_runs_are_problems_too():
    assert polaris("-A", "p", RANKS="16").problems == [
        "RANKS=16: 16 ranks do not fit the job's 8; the job has 2 node(s) x 4 ranks per node"
    ]
    assert polaris("-A", "p", BACKENDS="ddp dpp").problems[0].startswith("backend dpp: unknown backend 'dpp'")
    odd = polaris("-A", "p", SCALING="strong", GLOBAL_BATCH="100")
    assert odd.problems[0].startswith("the runs' settings: --scaling strong splits the global batch 100")


def test_horovod_without_nccl_is_refused_where_the_site_needs_it():
    # This machine's Horovod is a CPU build (gloo and MPI controllers, no NCCL operations).
    result = polaris("-A", "p", BACKENDS="horovod")
    assert len(result.problems) == 1 and result.problems[0].startswith(
        "backend horovod is built without nccl (mpi=True gloo=True nccl=False"
    )


def test_a_long_tmpdir_is_refused_where_ranks_share_gpus_under_mps(tmp_path):
    job = make_job("generic-pbs", str(tmp_path / "job"), {"BACKENDS": "ddp", "PROCS_PER_GPU": "2"}, gpus=1)
    environ = {"TMPDIR": "/local/scratch/pbs.3214567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov/with/some/more"}
    apply_site_environment(job, environ)
    result = in_job_checks(job, sweep_settings(job.profile, job.settings, REPO), environ)
    assert any(
        line.startswith(f"the MPS pipe directory {environ['TMPDIR']}/mps-123/pipe is")
        and line.endswith("set TMPDIR=/tmp")
        for line in result.problems
    ), result.problems


def test_the_request_is_the_directives_with_the_command_line_over_them():
    pbs = parse_submission(
        "pbs",
        POLARIS,
        [
            "-A",
            "p",
            "-l",
            "select=8:system=polaris:mpiprocs=4,walltime=00:30:00",
            "-v",
            "BACKENDS='ddp, deepspeed',STEPS=9",
        ],
        {},
    )
    assert (pbs.account, pbs.queue, pbs.nodes, pbs.tasks_per_node, pbs.walltime_s, pbs.filesystems) == (
        "p",
        "debug",
        8,
        4,
        1800,
        "home:eagle",
    )
    assert pbs.variables == {"BACKENDS": "ddp, deepspeed", "STEPS": "9"}  # PBS passes the -v list only
    slurm = parse_submission(
        "slurm", PERLMUTTER, ["-N8", "--time=2-00:00:00", "-qpremium", "--export=NONE,STEPS=9"], {"HOME": "/h"}
    )
    assert (slurm.nodes, slurm.walltime_s, slurm.queue, slurm.tasks_per_node, slurm.cpus_per_task) == (
        8,
        2 * 86400,
        "premium",
        4,
        32,
    )
    assert slurm.qos == "premium"  # at a QOS site the queue is the QOS
    frontier_job = parse_submission("slurm", FRONTIER, ["-q", "debug"], {}, "partition")
    assert (frontier_job.queue, frontier_job.qos) == ("batch", "debug")  # the directive's partition, -q beside it
    assert slurm.variables == {"STEPS": "9"}
    assert parse_submission("slurm", PERLMUTTER, [], {"HOME": "/h"}).variables == {"HOME": "/h"}  # --export=ALL


def test_a_bare_pbs_variable_takes_the_submitters_value():
    assert parse_pbs_variables("A,B=2,C='x,y'", {"A": "1"}) == {"A": "1", "B": "2", "C": "x,y"}


def aurora(*args: str, **variables: str):
    settings = {"BACKENDS": "ddp", "RESUBMIT": "0", **variables}  # debug queues allow no chaining
    return check_study("aurora", AURORA, [*args, "-v", ",".join(f"{k}={v}" for k, v in settings.items())], environ={})[
        0
    ]


def frontier(*args: str, environ=None):
    return check_study("frontier", FRONTIER, list(args), environ={"BACKENDS": "ddp", **PLUGINS, **(environ or {})})[0]


def test_the_aurora_and_frontier_templates_pass_once_the_account_is_given():
    assert aurora("-A", "DLscaling").ok and aurora("-A", "DLscaling").warnings == []
    assert aurora().problems == ["no account: aurora charges every job to one; pass -A <project>"]
    assert frontier("-A", "csc123").ok and frontier("-A", "csc123").warnings == []
    assert frontier().problems == [
        "no account: frontier charges every job to one; pass -A <account> (or SBATCH_ACCOUNT)"
    ]


@pytest.mark.parametrize(
    "check, args, problem",
    [
        (aurora, ["-q", "debug", "-l", "select=4"], "queue debug takes 1-2 nodes, not 4"),
        (aurora, ["-q", "debug-scaling", "-l", "select=1"], "queue debug-scaling takes 2-256 nodes, not 1"),
        (aurora, ["-q", "prod", "-l", "select=64"], "queue prod routes jobs of 64 node(s) nowhere"),
        (
            aurora,
            ["-q", "prod", "-l", "select=512", "-l", "walltime=18:00:00"],
            "walltime 18:00:00 exceeds queue small's 12:00:00; ask for at most 12:00:00",
        ),
        (aurora, ["-q", "small"], "queue small takes no submissions; submit to prod"),
        (frontier, ["-N", "16", "-t", "4:00:00"], "walltime 04:00:00 exceeds queue batch-bin5's 02:00:00"),
        (frontier, ["-N", "100", "-t", "12:00:00"], "walltime 12:00:00 exceeds queue batch-bin4's 06:00:00"),
        (frontier, ["-p", "extended", "-N", "65"], "queue extended takes 1-64 nodes, not 65"),
        (frontier, ["-p", "batch-bin5"], "queue batch-bin5 takes no submissions; submit to batch"),
    ],
)
def test_aurora_and_frontier_queues_refuse_what_they_do_not_take(check, args, problem):
    account = ["-A", "p"]
    result = check(*account, *args)
    assert any(line.startswith(problem) for line in result.problems), result.problems


def test_frontiers_extended_partition_takes_a_day_on_few_nodes():
    assert frontier("-A", "p", "-p", "extended", "-N", "8", "-t", "24:00:00").ok


DEBUG_NOTE = "OLCF prohibits job chaining and production work in the debug QOS"
ONE_AT_A_TIME = "QOS debug runs at most 1 job of yours at a time: this one waits while another of yours runs there"


@pytest.mark.parametrize(
    "args, environ, problem",
    [
        # 92 nodes: batch-bin4 takes 6 hours, the debug QOS 2
        (
            ["-q", "debug", "-N", "100", "-t", "4:00:00"],
            {"RESUBMIT": "0"},
            "walltime 04:00:00 exceeds QOS debug's 02:00:00; ask for at most 02:00:00, or submit without -q debug",
        ),
        (
            ["-q", "debug", "-t", "1:00:00"],
            {"RESUBMIT": "1"},
            f"RESUBMIT=1, but QOS debug allows no job chaining ({DEBUG_NOTE}); submit with RESUBMIT=0 (or auto), or "
            "without -q debug",
        ),
        (
            [],
            {"SBATCH_QOS": "debug", "RESUBMIT": "1"},  # sbatch reads the QOS from its environment, too
            f"RESUBMIT=1, but QOS debug allows no job chaining ({DEBUG_NOTE}); submit with RESUBMIT=0 (or auto), or "
            "without -q debug",
        ),
        (["-q", "dbug"], {}, "unknown frontier QOS 'dbug'; choose one of debug, or leave -q out for the default QOS"),
    ],
)
def test_frontiers_debug_qos_is_checked_beside_the_partition(args, environ, problem):
    assert frontier("-A", "p", *args, environ=environ).problems == [problem]


def test_frontiers_debug_qos_within_its_limits_passes_and_the_partition_is_still_checked():
    result = frontier("-A", "p", "-p", "batch", "-q", "debug", "-N", "16", "-t", "2:00:00", environ={"RESUBMIT": "0"})
    assert result.ok and result.warnings == [ONE_AT_A_TIME]
    auto = frontier("-A", "p", "-q", "debug", "-t", "1:00:00")  # RESUBMIT=auto: it will not chain there
    assert auto.ok and auto.warnings[1].startswith(f"QOS debug allows no job chaining ({DEBUG_NOTE}): a study cut")
    both = frontier("-A", "p", "-q", "debug", "-N", "16", "-t", "3:00:00", environ={"RESUBMIT": "0"})
    assert both.problems == [
        "walltime 03:00:00 exceeds queue batch-bin5's 02:00:00; ask for at most 02:00:00",
        "walltime 03:00:00 exceeds QOS debug's 02:00:00; ask for at most 02:00:00, or submit without -q debug",
    ]
    assert frontier("-A", "p", "-p", "extended", "-q", "debug", "-N", "65", environ={"RESUBMIT": "0"}).problems == [
        "queue extended takes 1-64 nodes, not 65; ask for a node count it takes or choose another queue"
    ]


def test_in_the_job_the_default_qos_passes_and_chaining_in_the_debug_qos_is_refused(tmp_path):
    def checks(qos: str, resubmit: str):
        record = JobRecord(
            "9",
            account="p",
            queue="batch",
            submit_queue="batch",
            walltime_s=3600,
            options={"partition": "batch", "qos": qos},
        )
        job = make_job(
            "frontier", str(tmp_path / qos), {"BACKENDS": "ddp", "RESUBMIT": resubmit}, record=record, gpus=8
        )
        environ = dict(PLUGINS)
        apply_site_environment(job, environ)
        return in_job_checks(job, sweep_settings(job.profile, job.settings, REPO), environ)

    normal = checks("normal", "1")  # a QOS the profile does not list: the scheduler took it, nothing to say
    assert normal.ok and normal.warnings == []
    assert checks("debug", "1").problems == [
        f"RESUBMIT=1, but QOS debug allows no job chaining ({DEBUG_NOTE}); submit with RESUBMIT=0 (or auto), or "
        "without -q debug"
    ]


def test_aurora_refuses_chaining_in_its_debug_queues_and_job_data_off_the_requested_file_systems():
    assert (
        aurora("-A", "p", RESUBMIT="1")
        .problems[0]
        .startswith("RESUBMIT=1, but queue debug allows no job chaining (one job per user queued or running")
    )
    assert aurora("-A", "p", RESUBMIT="auto").warnings[0].startswith("queue debug allows no job chaining")
    assert aurora("-A", "p", "-l", "filesystems=home", JOB_DIR="/lus/flare/projects/p/study").problems == [
        "JOB_DIR=/lus/flare/projects/p/study is on flare, which -l filesystems=home does not name; pass "
        "-l filesystems=home:flare"
    ]


def test_frontier_warns_about_job_data_in_home(tmp_path):
    home = tmp_path / "home"
    result = frontier("-A", "p", environ={"HOME": str(home), "JOB_DIR": str(home / "study")})
    assert result.ok and result.warnings[0].startswith(f"JOB_DIR={home / 'study'}: home (NFS, 50 GB quota) is not")


@pytest.mark.parametrize(
    "check, args, kind",
    [
        (polaris, ["-q", "ATPESC"], "training queue (e.g. ATPESC)"),
        (polaris, ["-q", "R1234567"], "reservation queue"),
        (polaris, ["-q", "preemptable"], "preemptable queue"),
        (aurora, ["-q", "ATPESC"], "training queue (e.g. ATPESC)"),
        (aurora, ["-q", "R98765"], "reservation queue"),
        (perlmutter, ["-q", "shared"], None),
    ],
)
def test_workshop_queues_pass_with_one_warning_that_their_limits_are_unknown(check, args, kind):
    """A workshop runs in queues the profile cannot list: accepted, and said so in one line."""
    result = check("-A", "DLscaling", *args)
    assert result.ok, result.problems
    (warning,) = result.warnings
    queue = args[1]
    assert warning.startswith(f"queue {queue} is a ") and "limits are unknown here and not checked" in warning
    assert kind is None or f"is a {kind}," in warning


def test_a_lowercase_queue_the_profile_does_not_know_is_still_refused():
    result = polaris("-A", "DLscaling", "-q", "prodd")
    assert not result.ok and any("prodd" in line for line in result.problems), result.problems


REGRESSION = "tests/helpers/tasks.py:regression"


def test_a_task_of_ones_own_becomes_every_runs_task_read_from_the_kit(tmp_path):
    from harness.study.jobs.settings import load_settings
    from harness.training.flags import parse_train_flags

    job = make_job(
        "polaris", str(tmp_path / "job"), {"TASK": REGRESSION, "TASK_ARGS": 'width=16 note="64" sizes=[1,2]'}, gpus=4
    )
    settings = job.settings
    assert (settings.task, settings.model, settings.dataset) == (f"{REPO}/{REGRESSION}", "", "")
    config = parse_train_flags(["--backend", "ddp", *settings.train_flags()])
    assert (config.task, config.task_args) == (f"{REPO}/{REGRESSION}", {"width": 16, "note": "64", "sizes": [1, 2]})
    # Without TASK, the images task with the site's MODEL and DATASET, as before tasks existed; a
    # study.json written then (no task fields) runs the same flags.
    images = make_job("polaris", str(tmp_path / "images"), {"DATA_DIR": str(tmp_path)}, gpus=4).settings
    assert images.train_flags()[:6] == ["--model", "resnet50", "--dataset", "synthetic", "--data-dir", str(tmp_path)]
    saved = json.loads(open(images.save()).read())
    del saved["task"], saved["task_args"]
    (tmp_path / "images" / "study.json").write_text(json.dumps(saved))
    assert load_settings(str(tmp_path / "images")).train_flags() == images.train_flags()


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"TASK": REGRESSION, "MODEL": "cnn", "DATASET": "digits"},
            "MODEL and DATASET are arguments of the images task, not of TASK=",
        ),
        (
            {"TASK": REGRESSION, "TASK_ARGS": "width"},
            "TASK_ARGS takes KEY=VALUE words separated by spaces, got 'width'",
        ),
        ({"TASK_ARGS": "model=cnn"}, "TASK_ARGS sets the images task's MODEL: set MODEL=... instead"),
        ({"TRAIN_ARGS": f"--task {REGRESSION}"}, "TRAIN_ARGS names the task; set TASK=... and TASK_ARGS="),
    ],
)
def test_task_settings_that_contradict_themselves_are_one_line(tmp_path, values, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        make_job("polaris", str(tmp_path / "job"), values, gpus=4)


def test_the_task_is_checked_before_the_queue_and_loaded_in_the_job(tmp_path):
    assert polaris("-A", "p", TASK=REGRESSION, TASK_ARGS="width=16").ok
    missing = f"{REPO}/mine/model.py"
    assert polaris("-A", "p", TASK="mine/model.py:make_task").problems == [
        f"TASK={missing}:make_task: no file {missing}; give the task file's path (a relative one is read from the kit)"
    ]
    assert polaris("-A", "p", TASK="mymodel").problems[0].startswith("TASK: unknown task 'mymodel'; choose a built-in")
    # Its module is imported on the job's node only: a function it lacks is found there, before anything runs.
    job = make_job("generic-pbs", str(tmp_path / "job"), {"BACKENDS": "ddp", "TASK": "tests/helpers/tasks.py:nothing"})
    environ: dict[str, str] = {}
    apply_site_environment(job, environ)
    result = in_job_checks(job, sweep_settings(job.profile, job.settings, REPO), environ)
    assert len(result.problems) == 1 and result.problems[0].startswith(
        f"task '{REPO}/tests/helpers/tasks.py:nothing': {REPO}/tests/helpers/tasks.py has no function 'nothing'"
    )

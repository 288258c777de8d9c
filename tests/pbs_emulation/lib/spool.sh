# shellcheck shell=bash
# Shared by the emulated PBS commands (qsub, qstat, qsig): where jobs are kept and how ids look.
#
# PBS_EMULATION_SPOOL holds `nodes`, the server's nodes (one hostname a line; optional: without it
# this machine stands in for every node), and per job number N:
#   N.attributes    `qstat -f` lines (Job_Name, Account_Name, queue, Resource_List.*, ...)
#   N.environment   the job's environment, NUL-separated NAME=VALUE entries
#   N.script        the copy of the job script that runs (PBS runs a copy, not the file you edit)
#   N.state         Q (queued, e.g. waiting on a dependency), R (running) or F (finished)
#   N.exit_status   the batch shell's exit status, once finished
#   N.shell_pid     the batch shell's process id while it runs (its own process group)
#   N.runner_pid    the process that runs the job (job_runner.sh, a session of its own)
#   N.depends_on    the job number it waits for (-W depend=afterany:ID), if any

JOB_ID_SUFFIX="polaris-pbs-emulated"

pbs_fail() {  # STATUS MESSAGE: one line on stderr, as PBS's clients print their refusals
    echo "${0##*/}: $2" >&2
    exit "$1"
}

spool_directory() {
    [[ -n "${PBS_EMULATION_SPOOL:-}" ]] || pbs_fail 2 "PBS_EMULATION_SPOOL is not set (the emulated server's spool directory)"
    mkdir -p "$PBS_EMULATION_SPOOL"
    echo "$PBS_EMULATION_SPOOL"
}

job_number() {  # a job id (N.server or N) -> N; fails for anything else
    local number="${1%%.*}"
    [[ "$number" =~ ^[0-9]+$ ]] || pbs_fail 2 "illegally formed job identifier: $1"
    echo "$number"
}

full_job_id() {  # N -> the id PBS_JOBID and qstat show
    echo "$1.$JOB_ID_SUFFIX"
}

job_state() {  # SPOOL N -> Q, R, F, or nothing for an unknown job
    cat "$1/$2.state" 2>/dev/null || true
}

job_exit_status() {  # SPOOL N -> the finished job's exit status
    cat "$1/$2.exit_status"
}

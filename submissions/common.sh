# shellcheck shell=bash
# The shell logic shared by the job templates (polaris.sc, perlmutter.sbatch, slurm-cpu.sbatch),
# sourced by each. A job runs one scaling study (every backend x rank count x repeat, through
# `harness sweep`) and leaves everything in one directory, JOB_DIR:
#
#   settings.env           the study's resolved settings; a resubmitted job reads them back
#   jobs.txt               the job chain: each job's start and end, signals, resubmissions (tab-separated)
#   discovery-<job>.jsonl  `harness env` of every rank under the site launcher, the first step of each job
#   results.jsonl          one record per finished run (backend x ranks x repeat), tagged with SWEEP_ID
#   logs/NNN-<backend>-<ranks>r-rep<k>.log  each run's output; logs/commands.txt: every command that ran
#   checkpoints/<backend>-<ranks>r-rep<k>/  each run's checkpoints (a resubmitted job resumes from them)
#   figures/scaling-{throughput,efficiency,breakdown}.{png,svg,json}   `harness plot`
#   report.md              `harness report`: throughput, speedup, efficiency, POP metrics
#   <name>-<job>.out, <name>.o<job>   every job's output: a resubmitted job writes it here, and the
#                          first job moves its file here from the submission directory
#
# A template sources this file and calls `job_begin pbs|slurm` (this job's id and nodes; a
# resubmitted job's settings), sets up the site's environment and its defaults, defines
#   site_launch RANKS PPN NODES  fill the array LAUNCH with the site launcher's words for that layout
#                                (RANKS etc. may be the sweep's placeholders {ranks} {ppn} {nodes})
#   start_mps / stop_mps         (optional) NVIDIA MPS on every node around the study, PROCS_PER_GPU > 1
# and calls run_study. It sets JOB_SCRIPT (the template to resubmit), KIT_DIR, RANKS_PER_NODE (the
# most ranks a node takes) and the study's defaults (BACKENDS MODEL DATASET BATCH_SIZE STEPS
# PRECISION THREADS CHECKPOINT_EVERY).
#
# Exit statuses of a job: 0 the study is complete, or it was preempted and resubmitted itself;
# 2 bad settings (one line naming the fix, before anything runs); 3 preempted and not resubmitted;
# 4 a rank died (the study stops; see the run's log); others: runs failed.

EXIT_USAGE=2
EXIT_PREEMPTED=3
EXIT_PEER_FAILURE=4

# Settings a resubmitted job takes from settings.env rather than from its environment, so that
# every job of a chain runs the same study. Templates add their own (DEPTH, SRUN_MPI, ...).
STUDY_SETTINGS=(BACKENDS NODES RANKS RANKS_PER_NODE SCALING REPEATS MODEL DATASET DATA_DIR BATCH_SIZE
                GLOBAL_BATCH EPOCHS STEPS PRECISION THREADS CHECKPOINT_EVERY TRAIN_ARGS PROCS_PER_GPU
                GPUS_PER_NODE SWEEP_ID RUN_TIMEOUT RESUBMIT MAX_RESUBMISSIONS PYTHON_ENV TRACE_STEPS)

job_say() {  # progress lines in the job's output
    printf '[job %s] %s\n' "$(date '+%F %T')" "$*"
}

job_fail() {  # MESSAGE [STATUS]: one line that names the fix, then exit (default: bad settings)
    echo "job: error: $1" >&2
    exit "${2:-$EXIT_USAGE}"
}

note_event() {  # one tab-separated line in JOB_DIR/jobs.txt: time, job id, event
    printf '%s\t%s\t%s\n' "$(date '+%FT%T')" "$SCHEDULER_JOB_ID" "$*" >> "$JOB_DIR/jobs.txt"
}

comma_list() {  # WORDS...: the words joined with commas
    local IFS=,
    echo "$*"
}

powers_of_two_up_to() {  # N: 1 2 4 ... up to N, and N itself
    local value=1 values=()
    while ((value < $1)); do
        values+=("$value")
        value=$((value * 2))
    done
    values+=("$1")
    echo "${values[*]}"
}

require_positive() {  # NAME...: each variable holds a positive integer
    local name
    for name in "$@"; do
        [[ "${!name}" =~ ^[1-9][0-9]*$ ]] || job_fail "$name=${!name} is not a positive integer"
    done
}

job_begin() {  # pbs | slurm
    SCHEDULER="$1"
    case "$SCHEDULER" in
        pbs)
            SCHEDULER_JOB_ID="$PBS_JOBID"
            ALLOCATED_NODES="$(grep -c . "$PBS_NODEFILE")" ;;
        slurm)
            SCHEDULER_JOB_ID="$SLURM_JOB_ID"
            ALLOCATED_NODES="$SLURM_JOB_NUM_NODES" ;;
    esac
    # A resubmitted job (JOB_DIR given and already holding settings.env) continues the first job's
    # study: same settings, same SWEEP_ID, whatever its own environment says.
    RESUMING_JOB_DIR=""
    if [[ -n "${JOB_DIR:-}" && -f "$JOB_DIR/settings.env" ]]; then
        # shellcheck source=/dev/null
        source "$JOB_DIR/settings.env"
        RESUMING_JOB_DIR=1
    fi
}

gpus_on_this_node() {  # what nvidia-smi lists; 0 where there is none (a CPU node)
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi -L | grep -c '^GPU' || true
    else
        echo 0
    fi
}

slurm_tasks_per_node() {  # the allocation's tasks per node: 4 from "4" or "4(x2)"
    local tasks="${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}"
    echo "${tasks%%[(,]*}"
}

load_site_modules() {  # SITE_MODULES: the site's modules the job loads (its CUDA, NCCL, Python)
    local modules name
    read -ra modules <<< "${SITE_MODULES//,/ }"  # lists take spaces or commas
    ((${#modules[@]} > 0)) || return 0
    command -v module > /dev/null || job_fail "SITE_MODULES=$SITE_MODULES, but this shell has no \`module\` command"
    set +u  # Lmod reads unset variables
    for name in "${modules[@]}"; do module load "$name"; done
    set -u
}

activate_python() {
    # PYTHON_ENV=venv: the kit's own .venv (`make setup`); site: the Python the site's modules put on
    # PATH (the template loads them). Either way the harness is this checkout's.
    case "$PYTHON_ENV" in
        venv)
            [[ -x "$KIT_DIR/.venv/bin/python" ]] || job_fail "no $KIT_DIR/.venv; run \`make setup\` in $KIT_DIR first, or submit with PYTHON_ENV=site"
            set +u  # activate scripts read unset variables
            # shellcheck source=/dev/null
            source "$KIT_DIR/.venv/bin/activate"
            set -u ;;
        site) ;;
        *) job_fail "PYTHON_ENV=$PYTHON_ENV: choose venv (the kit's .venv) or site (the site's modules)" ;;
    esac
    export PYTHONPATH="$KIT_DIR${PYTHONPATH:+:$PYTHONPATH}"
    python -c "import harness" 2> /dev/null || job_fail "this Python ($(command -v python)) cannot import the harness; with PYTHON_ENV=site load a module with torch, or use PYTHON_ENV=venv"
}

resolve_settings() {
    # Defaults every template shares; a template sets its own (MODEL, BACKENDS, ...) before this.
    : "${SCALING:=weak}" "${REPEATS:=1}" "${DATA_DIR:=}" "${GLOBAL_BATCH:=}" "${EPOCHS:=1000}"
    : "${TRAIN_ARGS:=}" "${PROCS_PER_GPU:=1}" "${RUN_TIMEOUT:=3600}" "${RESUBMIT:=1}" "${MAX_RESUBMISSIONS:=10}"
    # Notebook 03 draws a per-rank timeline from these steps of each run; bounded, so cheap.
    : "${TRACE_STEPS:=10}"
    [[ "$TRACE_STEPS" =~ ^[0-9]+$ ]] || job_fail "TRACE_STEPS=$TRACE_STEPS: a number of steps to trace per run (0: no timeline)"
    : "${NODES:=$(powers_of_two_up_to "$ALLOCATED_NODES")}"
    require_positive ALLOCATED_NODES RANKS_PER_NODE REPEATS EPOCHS STEPS BATCH_SIZE THREADS PROCS_PER_GPU RUN_TIMEOUT
    local nodes ranks per_node=()
    read -ra node_counts <<< "${NODES//,/ }"  # lists take spaces or commas
    for nodes in "${node_counts[@]}"; do
        [[ "$nodes" =~ ^[1-9][0-9]*$ ]] || job_fail "NODES=$NODES: node counts are positive integers, e.g. NODES=\"1 2 4\""
        ((nodes <= ALLOCATED_NODES)) || job_fail "NODES=$NODES asks for $nodes nodes but the job has $ALLOCATED_NODES; request more nodes or drop $nodes"
        per_node+=($((nodes * RANKS_PER_NODE)))
    done
    : "${RANKS:=${per_node[*]}}"
    read -ra rank_counts <<< "${RANKS//,/ }"
    for ranks in "${rank_counts[@]}"; do
        [[ "$ranks" =~ ^[1-9][0-9]*$ ]] || job_fail "RANKS=$RANKS: rank counts are positive integers, e.g. RANKS=\"1 2\""
        ((ranks <= ALLOCATED_NODES * RANKS_PER_NODE)) || job_fail "RANKS=$RANKS: $ranks ranks do not fit $ALLOCATED_NODES node(s) x $RANKS_PER_NODE ranks per node"
    done
    read -ra backend_list <<< "${BACKENDS//,/ }"
    ((${#backend_list[@]} > 0)) || job_fail "BACKENDS is empty; e.g. BACKENDS=\"ddp horovod deepspeed\""
    if ((PROCS_PER_GPU > 1 && ${GPUS_PER_NODE:-0} == 0)); then
        job_fail "PROCS_PER_GPU=$PROCS_PER_GPU shares GPUs between ranks, but this node has none; on CPUs run more RANKS with fewer THREADS each"
    fi
    local template_name
    template_name="$(basename "$JOB_SCRIPT")"
    : "${JOB_DIR:=$KIT_DIR/runs/${template_name%.*}-${SCHEDULER_JOB_ID%%.*}}"
    JOB_DIR="$(realpath -m "$JOB_DIR")"
    : "${SWEEP_ID:=$(basename "$JOB_DIR")}"
    export GPUS_PER_NODE PROCS_PER_GPU  # the GPU affinity helper reads them on every rank
    # NVIDIA MPS talks through pipes that must be on the node's own disk, one set per job.
    export CUDA_MPS_PIPE_DIRECTORY="${TMPDIR:-/tmp}/mps-${SCHEDULER_JOB_ID%%.*}/pipe"
    export CUDA_MPS_LOG_DIRECTORY="${TMPDIR:-/tmp}/mps-${SCHEDULER_JOB_ID%%.*}/log"
}

shell_join() {  # WORDS...: one command line, each word quoted for the shell
    python -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "$@"
}

template_join() {  # WORDS...: the same, but the sweep's placeholders ({ranks} ...) stay bare
    python -c 'import re, shlex, sys
print(" ".join(w if re.fullmatch(r"[{]\w+[}]", w) else shlex.quote(w) for w in sys.argv[1:]))' "$@"
}

build_sweep_command() {
    # `harness sweep` over the study, through the site launcher: SWEEP_COMMAND.
    site_launch '{ranks}' '{ppn}' '{nodes}'
    local template extra=()
    template="$(template_join "${LAUNCH[@]}") {python} -m harness train {args}"
    if [[ -n "$GLOBAL_BATCH" ]]; then extra+=(--global-batch "$GLOBAL_BATCH"); fi
    if [[ -n "$DATA_DIR" ]]; then extra+=(--data-dir "$DATA_DIR"); fi
    if ((PROCS_PER_GPU > 1)); then extra+=(--procs-per-gpu "$PROCS_PER_GPU"); fi
    local -a user_args
    read -ra user_args <<< "$TRAIN_ARGS"
    SWEEP_COMMAND=(python -m harness sweep --backends "$(comma_list "${backend_list[@]}")"
                   --ranks "$(comma_list "${rank_counts[@]}")" --scaling "$SCALING" --repeats "$REPEATS"
                   --ppn "$RANKS_PER_NODE" --launch-template "$template" --sweep-id "$SWEEP_ID"
                   --results "$JOB_DIR/results.jsonl" --log-dir "$JOB_DIR/logs"
                   --checkpoint-root "$JOB_DIR/checkpoints" --run-timeout "$RUN_TIMEOUT"
                   --model "$MODEL" --dataset "$DATASET" --batch-size "$BATCH_SIZE" --epochs "$EPOCHS"
                   --max-steps "$STEPS" --precision "$PRECISION" --threads "$THREADS"
                   --checkpoint-every "$CHECKPOINT_EVERY" --trace-steps "$TRACE_STEPS" "${extra[@]}" "${user_args[@]}")
}

save_settings() {
    local name
    for name in "${STUDY_SETTINGS[@]}"; do
        printf '%s=%q\n' "$name" "${!name-}"
    done > "$JOB_DIR/settings.env"
}

show_discovery() {
    # What every rank of the whole allocation discovers under the site launcher, before hours are
    # spent: a wrong rank layout stops the job here.
    local total=$((ALLOCATED_NODES * RANKS_PER_NODE))
    local file="$JOB_DIR/discovery-${SCHEDULER_JOB_ID%%.*}.jsonl"
    site_launch "$total" "$RANKS_PER_NODE" "$ALLOCATED_NODES"
    local command=("${LAUNCH[@]}" python -m harness env)
    job_say "discovery: $(shell_join "${command[@]}")"
    printf '# %s discovery\n%s\n' "$(date '+%F %T')" "$(shell_join "${command[@]}")" >> "$JOB_DIR/logs/commands.txt"
    local status=0
    timeout 600 "${command[@]}" > "$file" || status=$?
    cat "$file"
    ((status == 0)) || job_fail "discovery (\`harness env\` under the site launcher) failed with status $status; see the output above" 1
    local seen ranks_seen
    seen="$(grep -c "\"world_size\": ${total}[,}]" "$file" || true)"
    ranks_seen="$(grep -o '"rank": [0-9]*' "$file" | sort -u | wc -l)"
    if ((seen != total || ranks_seen != total)) || grep -q '"launcher": "none"' "$file"; then
        job_fail "discovery saw $ranks_seen distinct rank(s) and $seen with world size $total instead of $total ranks of $total (see $file); check the launcher's flags and RANKS_PER_NODE" 1
    fi
    job_say "discovery: $total ranks on $ALLOCATED_NODES node(s), $RANKS_PER_NODE per node, as planned"
}

forward_signal() {  # SIGNAL: the scheduler's warning reaches the sweep, which passes it to the run
    # USR1 is the warning the templates ask for before the time limit (Slurm's --signal, the PBS
    # timer): continue in a new job. TERM alone is scancel/qdel or the scheduler ending the job:
    # checkpoint, but do not resubmit (a cancelled job must not come back).
    if [[ "$1" == USR1 ]]; then WARNED_BEFORE_LIMIT=1; fi
    SIGNAL_RECEIVED="$1"
    note_event "signal $1"
    if [[ -n "${SWEEP_PID:-}" ]] && kill -0 "$SWEEP_PID" 2> /dev/null; then
        job_say "got SIG$1: passing it to the sweep (pid $SWEEP_PID); the running run checkpoints and stops"
        kill -s "$1" "$SWEEP_PID" 2> /dev/null || true
    else
        job_say "got SIG$1: no run is in progress; stopping before the next one"
    fi
}

run_sweep_in_background() {
    # The batch shell waits for the sweep in the background, so that a trapped signal runs at once
    # (a shell runs traps only between commands) and is forwarded; returns the sweep's status.
    "${SWEEP_COMMAND[@]}" &
    SWEEP_PID=$!
    local status=0
    wait "$SWEEP_PID" || status=$?
    while ((status > 128)) && kill -0 "$SWEEP_PID" 2> /dev/null; do  # wait was interrupted by a trap
        status=0
        wait "$SWEEP_PID" || status=$?
    done
    SWEEP_PID=""
    return "$status"
}

summarize() {  # figures and report from whatever records the study has so far
    local results="$JOB_DIR/results.jsonl"
    if [[ ! -s "$results" ]]; then
        job_say "no records yet: no figures or report"
        return 0
    fi
    mkdir -p "$JOB_DIR/figures"
    python -m harness plot "$results" -o "$JOB_DIR/figures/scaling" > /dev/null || job_say "harness plot failed (status $?)"
    python -m harness report "$results" > "$JOB_DIR/report.md" || job_say "harness report failed (status $?)"
    job_say "figures in $JOB_DIR/figures, report in $JOB_DIR/report.md"
}

scheduler_output_files() {  # where the scheduler writes this job's output and errors, one path a line
    case "$SCHEDULER" in
        pbs)
            local attributes
            attributes="$(qstat -f "$PBS_JOBID")"
            # PBS names them host:path.
            pbs_job_attribute "$attributes" Output_Path | sed 's|^[^:/]*:||'
            pbs_job_attribute "$attributes" Error_Path | sed 's|^[^:/]*:||' ;;
        slurm)
            local fields
            fields="$(scontrol show job -o "$SLURM_JOB_ID")"
            slurm_job_field "$fields" StdOut
            slurm_job_field "$fields" StdErr ;;
    esac
}

move_output_into_job_dir() {
    # The scheduler opened this job's output file where the job was submitted (the kit, for the
    # first job of a chain); renamed into JOB_DIR on the same file system, the file keeps receiving
    # the job's output, so everything the job produces lives in JOB_DIR.
    local path target
    while read -r path; do
        [[ -f "$path" && "$(dirname "$(realpath "$path")")" != "$JOB_DIR" ]] || continue
        target="$JOB_DIR/$(basename "$path")"
        if [[ ! -e "$target" && "$(stat -c %d "$path")" == "$(stat -c %d "$JOB_DIR")" ]] && mv "$path" "$target"; then
            job_say "this job's output continues in $target"
        fi
    done < <(scheduler_output_files | sort -u)
}

slurm_job_field() {  # FIELDS NAME: NAME's value in `scontrol show job -o` output
    sed -n "s|.* $2=\([^ ]*\).*|\1|p" <<< "$1"
}

resubmit_with_sbatch() {
    # The same resources as this job (also those given on sbatch's command line), after it ends;
    # its output goes into JOB_DIR.
    local fields value option name options=(--parsable --dependency "afterany:$SLURM_JOB_ID" --job-name "$SLURM_JOB_NAME"
                                             --output "$JOB_DIR/%x-%j.out")
    fields="$(scontrol show job -o "$SLURM_JOB_ID")"
    for option in nodes=NumNodes ntasks=NumTasks cpus-per-task=CPUs/Task time=TimeLimit account=Account \
                  qos=QOS partition=Partition; do
        value="$(slurm_job_field "$fields" "${option#*=}")"
        if [[ -n "$value" && "$value" != "(null)" && "$value" != UNLIMITED ]]; then
            options+=("--${option%%=*}" "${value%%-*}")
        fi
    done
    # sbatch exports this shell's environment to the new job: leave out this job's own SLURM_*
    # variables, which would otherwise leak into the new job's steps.
    local unset_job_variables=()
    while read -r name; do
        [[ "$name" == SLURM_CONF ]] || unset_job_variables+=(-u "$name")
    done < <(compgen -e SLURM_)
    local new_job
    new_job="$(env "${unset_job_variables[@]}" JOB_DIR="$JOB_DIR" SWEEP_ID="$SWEEP_ID" KIT_DIR="$KIT_DIR" \
               sbatch "${options[@]}" "$JOB_SCRIPT")"
    echo "${new_job%%;*}"
}

pbs_job_attribute() {  # ATTRIBUTES NAME: NAME's value in `qstat -f` output
    sed -n "s|^ *$2 = ||p" <<< "$1" | head -n 1
}

resubmit_with_qsub() {
    # The same resources as this job (also those given on qsub's command line), after it ends; its
    # output goes into JOB_DIR (-o DIRECTORY: <name>.o<id> there); PBS passes no environment to a
    # job but the -v variables.
    local attributes resource value options=(-W "depend=afterany:$PBS_JOBID" -o "$JOB_DIR")
    attributes="$(qstat -f "$PBS_JOBID")"
    options+=(-A "$(pbs_job_attribute "$attributes" Account_Name)" -q "$(pbs_job_attribute "$attributes" queue)"
              -N "$(pbs_job_attribute "$attributes" Job_Name)")
    for resource in select place walltime filesystems; do
        value="$(pbs_job_attribute "$attributes" "Resource_List.$resource")"
        if [[ -n "$value" ]]; then options+=(-l "$resource=$value"); fi
    done
    options+=(-v "JOB_DIR='$JOB_DIR',SWEEP_ID='$SWEEP_ID',KIT_DIR='$KIT_DIR'")
    qsub "${options[@]}" "$JOB_SCRIPT"
}

resubmit_job() {  # prints the new job's id
    case "$SCHEDULER" in
        pbs) resubmit_with_qsub ;;
        slurm) resubmit_with_sbatch ;;
    esac
}

arm_stop_before_walltime() {
    # PBS warns a job only with SIGTERM at the walltime and kills it kill_delay seconds later; so the
    # job warns itself (SIGUSR1, as Slurm's --signal does) STOP_BEFORE_WALLTIME seconds earlier.
    STOP_TIMER_PID=""
    ((STOP_BEFORE_WALLTIME > 0)) || return 0
    local walltime seconds=0 part
    walltime="$(pbs_job_attribute "$(qstat -f "$PBS_JOBID")" Resource_List.walltime)"
    local -a parts
    IFS=: read -ra parts <<< "$walltime"
    for part in "${parts[@]}"; do seconds=$((seconds * 60 + 10#$part)); done
    local delay=$((seconds - STOP_BEFORE_WALLTIME - SECONDS))
    ((delay > 0)) || job_fail "walltime $walltime leaves no time before STOP_BEFORE_WALLTIME=$STOP_BEFORE_WALLTIME s; ask for more walltime or lower it"
    sleep "$delay" && kill -s USR1 "$$" &
    STOP_TIMER_PID=$!
    job_say "will checkpoint and resubmit at $(date -d "+$delay seconds" '+%F %T'), $STOP_BEFORE_WALLTIME s before the walltime ($walltime)"
}

disarm_stop_timer() {
    if [[ -n "${STOP_TIMER_PID:-}" ]]; then
        pkill -P "$STOP_TIMER_PID" sleep 2> /dev/null || true
        kill "$STOP_TIMER_PID" 2> /dev/null || true
    fi
}

continue_after_preemption() {
    # Status 3: the interrupted run has a checkpoint. Resubmit this template for the same JOB_DIR
    # and SWEEP_ID (the new job skips finished runs and resumes this one), unless told not to.
    local resubmissions
    resubmissions="$(grep -c $'\tresubmitted as ' "$JOB_DIR/jobs.txt" || true)"
    local again="submit $JOB_SCRIPT again with JOB_DIR=$JOB_DIR SWEEP_ID=$SWEEP_ID to continue"
    if [[ "$SIGNAL_RECEIVED" == TERM && -z "$WARNED_BEFORE_LIMIT" ]]; then
        job_say "stopped by SIGTERM (scancel/qdel, or the scheduler ending the job) after a checkpoint; not resubmitting; $again"
        exit "$EXIT_PREEMPTED"
    fi
    if [[ "$RESUBMIT" != 1 ]]; then
        job_say "preempted after a checkpoint; RESUBMIT=$RESUBMIT, so $again"
        exit "$EXIT_PREEMPTED"
    fi
    if ((resubmissions >= MAX_RESUBMISSIONS)); then
        job_say "preempted again after $resubmissions resubmissions (MAX_RESUBMISSIONS); $again"
        exit "$EXIT_PREEMPTED"
    fi
    local new_job
    if ! new_job="$(resubmit_job)"; then
        job_say "preempted after a checkpoint, but resubmitting failed; $again"
        exit "$EXIT_PREEMPTED"
    fi
    note_event "resubmitted as $new_job"
    job_say "preempted after a checkpoint; continues as job $new_job (same JOB_DIR, SWEEP_ID $SWEEP_ID)"
    exit 0
}

run_study() {
    resolve_settings
    build_sweep_command
    # Bad settings (a backend, a batch that does not split, ...) fail here, before anything is written.
    "${SWEEP_COMMAND[@]}" --dry-run > /dev/null || job_fail "the sweep's settings were refused (see above); nothing ran" "$EXIT_USAGE"
    mkdir -p "$JOB_DIR/logs"
    move_output_into_job_dir
    if [[ -z "$RESUMING_JOB_DIR" ]]; then save_settings; fi
    SIGNAL_RECEIVED=""
    WARNED_BEFORE_LIMIT=""
    SWEEP_PID=""
    trap 'forward_signal USR1' USR1
    trap 'forward_signal TERM' TERM
    note_event "start on $(hostname): $ALLOCATED_NODES node(s) x $RANKS_PER_NODE ranks"
    job_say "study $SWEEP_ID: backends ${backend_list[*]}, ranks ${rank_counts[*]}, $SCALING scaling, $MODEL on $DATASET, in $JOB_DIR"
    show_discovery
    if [[ "$SCHEDULER" == pbs ]]; then arm_stop_before_walltime; fi
    local mps="" status=0
    if ((PROCS_PER_GPU > 1)) && declare -F start_mps > /dev/null; then
        start_mps
        mps=1
    fi
    if [[ -z "$SIGNAL_RECEIVED" ]]; then
        job_say "sweep: $(shell_join "${SWEEP_COMMAND[@]}")"
        run_sweep_in_background || status=$?
    else
        status=$EXIT_PREEMPTED  # warned before the sweep started: nothing to checkpoint, resubmit
    fi
    disarm_stop_timer
    if [[ -n "$mps" ]]; then stop_mps; fi
    note_event "end: sweep status $status"
    summarize
    case "$status" in
        0)
            note_event "study complete"
            job_say "study complete: $JOB_DIR" ;;
        "$EXIT_PREEMPTED")
            continue_after_preemption ;;
        "$EXIT_PEER_FAILURE")
            job_say "a rank died during a run (status 4): the study stops here; see the run's log in $JOB_DIR/logs, then submit again with JOB_DIR=$JOB_DIR SWEEP_ID=$SWEEP_ID to finish it"
            exit "$EXIT_PEER_FAILURE" ;;
        *)
            job_say "the sweep failed (status $status); see $JOB_DIR/logs"
            exit "$status" ;;
    esac
}

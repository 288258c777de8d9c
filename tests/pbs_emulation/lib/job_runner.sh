#!/bin/bash
# Runs one emulated PBS job (started by qsub, detached): waits for its dependency, then runs the
# spooled copy of the script with its #! interpreter in the user's home directory, in a fresh
# environment (the job's), in a process group of its own; records state and exit status.
# Usage: job_runner.sh SPOOL NUMBER
set -euo pipefail

# shellcheck source=tests/pbs_emulation/lib/spool.sh
source "$(dirname "${BASH_SOURCE[0]}")/spool.sh"

spool="$1"
number="$2"
echo "$$" > "$spool/$number.runner_pid"
attribute() {  # NAME -> the job's attribute value
    sed -n "s/^    $1 = //p" "$spool/$number.attributes"
}

if [[ -f "$spool/$number.depends_on" ]]; then  # afterany: start once that job has ended, however
    dependency="$(cat "$spool/$number.depends_on")"
    while [[ -n "$(job_state "$spool" "$dependency")" && "$(job_state "$spool" "$dependency")" != F ]]; do
        sleep 0.5
    done
fi

mapfile -d '' environment < "$spool/$number.environment"
interpreter=(/bin/bash)
read -r first_line < "$spool/$number.script" || true
if [[ "$first_line" == "#!"* ]]; then read -ra interpreter <<< "${first_line#"#!"}"; fi
output="$(attribute Output_Path)"
error="$(attribute Error_Path)"
if [[ "$(attribute Join_Path)" == oe ]]; then error="$output"; fi

set -m  # the batch shell gets a process group of its own
cd "$spool/home"
echo "    stime = $(date '+%a %b %e %H:%M:%S %Y')" >> "$spool/$number.attributes"  # as PBS's ctime() writes it
echo R > "$spool/$number.state"
status=0
if [[ "$error" == "$output" ]]; then
    env -i "${environment[@]}" "${interpreter[@]}" "$spool/$number.script" > "$output" 2>&1 &
else
    env -i "${environment[@]}" "${interpreter[@]}" "$spool/$number.script" > "$output" 2> "$error" &
fi
echo "$!" > "$spool/$number.shell_pid"
wait "$!" || status=$?
echo "$status" > "$spool/$number.exit_status"
rm -f "$spool/$number.shell_pid"
echo F > "$spool/$number.state"

"""`qstat -fF json` of the emulated PBS: the spooled attributes of jobs as PBS Pro's JSON.

Usage: qstat_json.py SPOOL SUFFIX NUMBER...  Resource_List.* become one object (numbers as numbers,
as PBS prints nodect), Variable_List holds the job's PBS_O_* and -v (or -V) variables, job_state
and Exit_status come from the spool. `qstat_json.py --variable-list SPOOL NUMBER` prints plain
`qstat -f`'s Variable_List line instead: NAME=VALUE items joined by commas, a comma inside a value
escaped with a backslash.
"""

import json
import os
import sys
import time

# What the emulated job's environment holds besides PBS_O_* and the -v variables (PBS sets these
# for the job; they are not part of Variable_List).
JOB_ONLY = {"HOME", "USER", "LOGNAME", "SHELL", "LANG", "PATH", "TMPDIR"}


def job(spool: str, number: str) -> dict:
    entry: dict = {"Resource_List": {}, "Variable_List": {}}
    with open(os.path.join(spool, f"{number}.attributes")) as handle:
        for line in handle:
            name, _, value = line.strip().partition(" = ")
            if name.startswith("Resource_List."):
                entry["Resource_List"][name.split(".", 1)[1]] = int(value) if value.isdigit() else value
            else:
                entry[name] = value
    with open(os.path.join(spool, f"{number}.environment")) as handle:
        for item in handle.read().split("\0"):
            name, _, value = item.partition("=")
            if name and (name.startswith("PBS_O_") or not (name in JOB_ONLY or name.startswith("PBS_"))):
                entry["Variable_List"][name] = value
    with open(os.path.join(spool, f"{number}.state")) as handle:
        entry["job_state"] = handle.read().strip()
    if entry["job_state"] == "F":
        with open(os.path.join(spool, f"{number}.exit_status")) as handle:
            entry["Exit_status"] = int(handle.read().strip())
    return entry


def main() -> None:
    if sys.argv[1] == "--variable-list":
        variables = job(sys.argv[2], sys.argv[3])["Variable_List"]
        items = ",".join(f"{name}={value.replace(',', chr(92) + ',')}" for name, value in variables.items())
        print(f"    Variable_List = {items}")
        return
    spool, suffix, numbers = sys.argv[1], sys.argv[2], sys.argv[3:]
    jobs = {f"{number}.{suffix}": job(spool, number) for number in numbers}
    print(
        json.dumps(
            {"timestamp": int(time.time()), "pbs_version": "2022.1.3-emulated", "pbs_server": suffix, "Jobs": jobs},
            indent=4,
        )
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Sourced by the job templates: `load_modules NAME...` loads each of the site's modules, and one that
# fails to load is named in one line, exit 2 (Python has not started yet to say it).
set -euo pipefail

load_modules() {
    local name
    for name in "$@"; do
        if ! module load "$name" 2>/dev/null; then
            echo "job: error: \`module load $name\` failed; \`module avail ${name%%/*}\` lists what this site has (set SITE_MODULES to choose)" >&2
            exit 2
        fi
    done
}

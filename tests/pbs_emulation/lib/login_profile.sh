# shellcheck shell=bash
# The emulated Polaris user's login environment (sourced from ~/.bash_profile of an emulated job):
# what the site's profile provides there. The Cray PALS `mpiexec` and the PBS clients are on PATH,
# ahead of the submitter's PATH; `module` is a shell function, as Lmod's is, for which `use` and
# `load` (and `list`) do nothing here, and so is `conda` (which ALCF's conda module defines), for
# which `activate` does nothing: the jobs under test use the kit's .venv.

PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/../bin" && pwd):${PBS_O_PATH:-$PATH}"
export PATH

module() {
    case "${1:-}" in
        use | load | list)
            echo "module (emulated): $* (no-op)" >&2 ;;
        *)
            echo "module (emulated): 'module ${1:-}' is not emulated; only use, load and list are" >&2
            return 1 ;;
    esac
}

conda() {
    case "${1:-}" in
        activate | deactivate)
            echo "conda (emulated): $* (no-op)" >&2 ;;
        *)
            echo "conda (emulated): 'conda ${1:-}' is not emulated; only activate and deactivate are" >&2
            return 1 ;;
    esac
}

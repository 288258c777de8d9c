"""The shape the tree promises: no import cycles inside the package, one loop that never asks which
backend it runs, and backend knowledge inside harness/backends/ only.

Read from the source with `ast`, imports inside functions included (a deferred import is still a
dependency; deferring it only hides a cycle).
"""

from __future__ import annotations

import ast
import os
import re

from tests.conftest import LANE_TIER_ORDER, REPO

PACKAGE = os.path.join(REPO, "harness")


def _modules() -> dict[str, str]:
    found = {}
    for root, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                found[module[: -len(".__init__")] if module.endswith(".__init__") else module] = path
    return found


def _type_checking_lines(path: str) -> set[int]:
    lines = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            for inner in ast.walk(node):
                if hasattr(inner, "lineno"):
                    lines.add(inner.lineno)
    return lines


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports at run time (TYPE_CHECKING imports left out)."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        skip = _type_checking_lines(path)
        source = open(path).read().splitlines()
        kept = "\n".join("" if number + 1 in skip else line for number, line in enumerate(source))
        graph[module] = _imports_from_source(module, path, kept, set(modules))
    return graph


def _imports_from_source(module: str, path: str, source: str, known: set[str]) -> set[str]:
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            candidates = [f"{name}.{alias.name}" for alias in node.names] + [name]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rsplit(".", 1)[0] if "." in candidate else ""
            if candidate and candidate != module:
                targets.add(candidate)
                break
    return targets


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle once, as the list of modules around it (packages import their submodules
    by design, so an edge from a package to its own submodule does not close a cycle)."""
    cycles, seen = [], set()

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if node == target.rsplit(".", 1)[0] and target.startswith(node + "."):
                continue
            if target in path:
                cycle = path[path.index(target) :]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append(cycle + [target])
            elif len(path) < 12:
                visit(target, path + [target])

    for start in sorted(graph):
        visit(start, [start])
    return cycles


def test_the_package_has_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert cycles == [], "\n".join(" -> ".join(cycle) for cycle in cycles)


FOUNDATION = {
    "harness.errors",
    "harness.fileio",
    "harness.version",
    "harness.config",
    "harness.lazy",
    "harness.options",
}
TOP = {"harness", "harness.cli", "harness.cli_commands", "harness.__main__"}
# Each layer package and the packages it may import (itself and the foundation always allowed).
LAYERS = {
    "harness.process": set(),
    "harness.backends": {"harness.process"},
    "harness.data": {"harness.process"},
    "harness.tasks": {"harness.process", "harness.data"},
    "harness.training": {"harness.process", "harness.backends", "harness.data", "harness.tasks"},
    "harness.study": {"harness.process", "harness.backends", "harness.data", "harness.tasks", "harness.training"},
    "harness.workshop": {
        "harness.process",
        "harness.backends",
        "harness.data",
        "harness.tasks",
        "harness.training",
        "harness.study",
    },
}
# The study layer's packages and which of the others each may import: the site profiles stand
# alone, prediction reads scaling's records and intervals and the sites' networks and devices, jobs
# runs all three, scaling stands alone but for its HTML report's lazy look at the prediction a job
# wrote (the one import checked by name).
STUDY_PACKAGES = {
    "harness.study.sites": set(),
    "harness.study.scaling": set(),
    "harness.study.prediction": {"harness.study.scaling", "harness.study.sites"},
    "harness.study.jobs": {"harness.study.scaling", "harness.study.prediction", "harness.study.sites"},
}
STUDY_EXCEPTIONS = {("harness.study.scaling.html_report", "harness.study.prediction.foresight")}
FRAMEWORKS = ("horovod", "deepspeed", "torch.nn.parallel", "torch.distributed.fsdp")
MODULE_LINES = 500
FUNCTION_LINES = 60


def _layer(module: str) -> str:
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            return layer
    return module


def test_every_module_belongs_to_a_layer_or_the_root():
    strays = [m for m in _modules() if m not in FOUNDATION | TOP and _layer(m) not in LAYERS]
    assert strays == [], f"modules outside the layers: {strays}; put each in the package of its layer"


def test_each_layer_imports_only_the_layers_below_it():
    offenders = []
    for module, targets in import_graph().items():
        layer = _layer(module)
        if layer not in LAYERS:
            continue
        allowed = LAYERS[layer] | {layer}
        for target in sorted(targets):
            if target not in FOUNDATION and _layer(target) not in allowed:
                offenders.append(f"{module} imports {target}")
    assert offenders == [], "\n".join(offenders)


def test_the_study_layer_is_sites_scaling_prediction_and_jobs_each_importing_only_what_it_may():
    modules = _modules()
    loose = [m for m in modules if m.startswith("harness.study.") and not m.startswith(tuple(STUDY_PACKAGES))]
    assert loose == [], f"study modules outside its packages: {loose}"
    offenders = []
    for module, targets in import_graph().items():
        own = next((package for package in STUDY_PACKAGES if module.startswith(package)), None)
        if own is None:
            continue
        for target in sorted(targets):
            other = next((package for package in STUDY_PACKAGES if target.startswith(package)), own)
            if other != own and other not in STUDY_PACKAGES[own] and (module, target) not in STUDY_EXCEPTIONS:
                offenders.append(f"{module} imports {target}")
    assert offenders == [], "\n".join(offenders)
    for package in STUDY_PACKAGES:
        assert ast.get_docstring(ast.parse(open(modules[package]).read())), f"{package} says what it is"


def test_the_foundation_imports_only_itself_and_leaf_modules():
    graph = import_graph()
    for module in FOUNDATION:
        for target in graph[module] - FOUNDATION:
            assert not graph[target], f"{module} imports {target}, which imports {sorted(graph[target])}"


def test_every_layer_says_what_it_is():
    for layer in LAYERS:
        path = _modules()[layer]
        doc = ast.get_docstring(ast.parse(open(path).read()))
        assert doc and "layer" in doc.split("\n", 1)[0].lower(), f"{path}: the docstring's first line names the layer"


def test_no_framework_is_imported_outside_backends():
    offenders = []
    for module, path in _modules().items():
        if module.startswith("harness.backends"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                if any(name == framework or name.startswith(framework + ".") for framework in FRAMEWORKS):
                    offenders.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: imports {name}")
    assert offenders == [], "\n".join(offenders)


def test_sizes_a_reader_can_hold():
    too_long = []
    for module, path in _modules().items():
        source = open(path).read()
        if source.count("\n") > MODULE_LINES:
            too_long.append(f"{os.path.relpath(path, REPO)}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES and not _is_declaration(node):
                    too_long.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: {node.name} has {length} lines")
    assert too_long == [], "\n".join(too_long)


def _is_declaration(function: ast.FunctionDef) -> bool:
    """A parser built from declarations (add_argument calls one after another) may be long."""
    calls = [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Call)
        and getattr(n.func, "attr", "")
        in ("add_argument", "add_parser", "add_argument_group", "add_mutually_exclusive_group", "set_defaults")
    ]
    return len(calls) >= 15


def _backend_names() -> list[str]:
    from harness.backends import BACKENDS

    return list(BACKENDS)


def test_the_loop_never_asks_which_backend_it_runs():
    source = open(os.path.join(PACKAGE, "training", "loop.py")).read()
    for name in _backend_names():
        assert not re.search(rf"""["']{name}["']""", source), f"loop.py mentions backend {name!r}"
    assert "isinstance(backend" not in source and "config.backend ==" not in source


def test_backend_names_appear_only_inside_backends():
    """Outside harness/backends/, code finds backends through the registry, never by name."""
    offenders = []
    for module, path in _modules().items():
        if module.startswith("harness.backends"):
            continue
        for number, line in enumerate(open(path).read().splitlines(), 1):
            code = line.split("#", 1)[0]
            if "backend" not in code:
                continue
            for name in _backend_names():
                if re.search(rf"""(==|!=|in \(|\bis\b)\s*["']{name}["']|["']{name}["']\s*(==|!=)""", code):
                    offenders.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    assert offenders == [], "\n".join(offenders)


# -- the tests' own shape ------------------------------------------------------------------------

TESTS = os.path.join(REPO, "tests")


def _test_modules() -> list[str]:
    """Every test module under tests/, relative to tests/."""
    found = []
    for root, _, names in os.walk(TESTS):
        found += [
            os.path.relpath(os.path.join(root, name), TESTS) for name in names if re.match(r"test_.*\.py$", name)
        ]
    return sorted(found)


def test_every_test_module_is_in_a_tier_that_make_test_runs():
    tiers = re.search(r"^TIERS := (.+)$", open(os.path.join(REPO, "Makefile")).read(), re.M).group(1).split()
    assert all(os.path.isfile(os.path.join(REPO, tier, "__init__.py")) for tier in tiers), tiers
    outside = [
        path
        for path in _test_modules()
        if path != "test_architecture.py" and not any(f"tests/{path}".startswith(f"{tier}/") for tier in tiers)
    ]
    assert outside == [], f"move these into one of {tiers} (see tests/unit/conftest.py for the unit tier's rule)"


def test_tests_that_read_the_machines_load_run_alone():
    # `make test` runs two lanes side by side, then the `alone` tests one at a time: a test that reads
    # machine-wide load or pins a core would see the other lane's load as another program's.
    makefile = open(os.path.join(REPO, "Makefile")).read()
    assert '-m "not gpu and not alone"' in makefile and '-m "not gpu and alone"' in makefile
    tiers = re.search(r"^TIERS := (.+)$", makefile, re.M).group(1).split()
    assert sorted(tier.rstrip("/") for tier in LANE_TIER_ORDER) == sorted(tiers), "the lanes order every tier"
    unmarked = [
        path
        for path in _test_modules()
        if re.search(
            r"tests\.helpers\.machine_load|sched_setaffinity", source := open(os.path.join(TESTS, path)).read()
        )
        and "pytestmark = pytest.mark.alone" not in source
    ]
    assert unmarked == [], "mark these `pytestmark = pytest.mark.alone` (they read the machine's load)"


def test_tests_load_weights_and_find_ports_through_the_harness():
    # One weights loader (tests/helpers/weights.py, over harness.fileio.load_tensors) and one free-port
    # finder (harness.process.launchers.free_port): a test that writes its own hides a difference.
    offending = []
    for root, _, names in os.walk(TESTS):
        for name in (name for name in names if name.endswith(".py") and name != "test_architecture.py"):
            path = os.path.join(root, name)
            source = open(path).read()
            offending += [
                f"{os.path.relpath(path, REPO)}: {call}" for call in ("torch.load(", ".bind((") if call in source
            ]
    assert offending == []


# -- One way to do each thing ------------------------------------------------------------------

SIGNAL_HELPER = "harness.process.signals"
ENVIRONMENT_HELPER = "harness.process.environment"
REQUIRE_HELPER = "harness.errors"
# Permanent changes to this process's environment, each made for the processes or libraries that
# read it later, so there is nothing to restore (every temporary change goes through the helper).
PERMANENT_ENVIRONMENT = {
    "harness.backends.deepspeed": "DeepSpeedScriptHooks.limit_collective_waits: DEEPSPEED_TIMEOUT for a whole checked script",
    "harness.backends.horovod": "HorovodScriptHooks.limit_collective_waits: HOROVOD_GLOO_TIMEOUT_SECONDS for a whole checked script",
    "harness.workshop.engines": "IPP_NONINTERACTIVE, read once when ipyparallel is imported",
    "harness.workshop.exercise": "torchrun's variables, exported for the script's env:// and its children",
}
# ImportError handlers that may raise their own error: not a missing library but a version gap.
IMPORT_ERROR_RAISERS = {"harness.backends.compat": "a DeepSpeed class missing from the installed version"}
# Modules that look for a library without importing it other than through require.
FIND_SPEC_USERS = {"harness.process.accelerator": "a probe choosing XCCL or oneCCL; its UsageError names both"}
# Modules run as scripts of their own that may not import the harness, so set their handlers directly.
SIGNAL_SCRIPTS = {
    "harness.process.heartbeat_store": "a stdlib-only process beside rank 0; it ignores the job's signals"
}
ENVIRON_MUTATORS = {"pop", "update", "setdefault", "clear", "popitem", "__setitem__", "__delitem__"}


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and getattr(node.value, "id", "") == "os"


def _environ_changes(tree: ast.AST) -> list[int]:
    """Lines that change os.environ: item assignment or deletion, a mutating method, os.putenv/unsetenv."""
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else []
        targets = [node.target] if isinstance(node, ast.AugAssign) else targets
        if any(isinstance(t, ast.Subscript) and _is_os_environ(t.value) for t in targets):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if (node.func.attr in ENVIRON_MUTATORS and _is_os_environ(node.func.value)) or (
                node.func.attr in ("putenv", "unsetenv") and getattr(node.func.value, "id", "") == "os"
            ):
                lines.append(node.lineno)
    return lines


def test_signal_handlers_are_installed_by_the_signal_helper_only():
    offenders = []
    for module, path in _modules().items():
        if module in (SIGNAL_HELPER, *SIGNAL_SCRIPTS):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "signal":
                if getattr(node.func.value, "id", "") == "signal":
                    offenders.append(
                        f"{os.path.relpath(path, REPO)}:{node.lineno}: signal.signal (use {SIGNAL_HELPER})"
                    )
            if isinstance(node, ast.ImportFrom) and node.module == "signal":
                if any(alias.name == "signal" for alias in node.names):
                    offenders.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: from signal import signal")
    assert offenders == [], "\n".join(offenders)


def test_the_environment_is_changed_for_a_while_only_through_the_helper():
    offenders = [
        f"{os.path.relpath(path, REPO)}:{line}: changes os.environ (use {ENVIRONMENT_HELPER}.patched_environ)"
        for module, path in _modules().items()
        if module != ENVIRONMENT_HELPER and module not in PERMANENT_ENVIRONMENT
        for line in _environ_changes(ast.parse(open(path).read()))
    ]
    assert offenders == [], "\n".join(offenders)
    for module, reason in PERMANENT_ENVIRONMENT.items():  # the allow-list stays as short as the tree needs
        assert _environ_changes(ast.parse(open(_modules()[module]).read())), f"{module} no longer needs: {reason}"


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(getattr(name, "id", "") in ("ImportError", "ModuleNotFoundError") for name in names)


def test_a_missing_library_is_reported_by_the_require_helper_only():
    """No `except ImportError` raises an error of its own, and no find_spec decides alone (a missing
    scikit-learn once raised RuntimeError so): harness.errors.require raises the UsageError that names
    the install step."""
    offenders = []
    for module, path in _modules().items():
        if module in (REQUIRE_HELPER, *IMPORT_ERROR_RAISERS):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None and _catches_import_error(node):
                if any(isinstance(inner, ast.Raise) for inner in ast.walk(node)):
                    offenders.append(
                        f"{os.path.relpath(path, REPO)}:{node.lineno}: raises on ImportError (use require)"
                    )
            if module not in FIND_SPEC_USERS and isinstance(node, ast.Attribute) and node.attr == "find_spec":
                offenders.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: find_spec (use require(load=False))")
    assert offenders == [], "\n".join(offenders)


def test_harness_train_is_the_loops_train_and_traces_merge_where_they_are_made():
    graph = import_graph()
    root = ast.parse(open(_modules()["harness"]).read())
    (train,) = [node for node in root.body if isinstance(node, ast.FunctionDef) and node.name == "train"]
    imported = {node.module for node in ast.walk(train) if isinstance(node, ast.ImportFrom)}
    assert imported == {"training.loop"}, f"harness.train imports {imported}; it only runs the loop's train"
    definitions = [
        module
        for module, path in _modules().items()
        for node in ast.walk(ast.parse(open(path).read()))
        if isinstance(node, ast.FunctionDef) and node.name == "merge_traces" and module != "harness"
    ]
    assert definitions == ["harness.training.trace"]
    assert "harness.training.trace" in graph["harness.training.profiling"]


PROCESS_HELPER = "harness.process.processes"
# Reads of /proc that stay outside the helper: a rank's measurement of itself in the timed window,
# where a scan of every process through psutil would cost the window more than it measures.
PROC_READERS = {
    "harness.training.contention": "the loader workers' CPU time and the cores' busy time, read in the timed window"
}
PER_PROCESS_PROC = re.compile(
    r"""/proc/\{|listdir\(\s*(PROC|["']/proc["'])\s*\)|\bimport psutil\b|require\(\s*["']psutil"""
)


def test_other_processes_are_found_and_read_through_the_process_helper_only():
    # One way to find a process by its environment or command line, to read its parent, session,
    # name or start time, to ask whether it runs and to end it: a test helper that parses /proc
    # by hand hides a difference (a zombie counted as running, a pid reused).
    sources = {module: path for module, path in _modules().items() if module not in (PROCESS_HELPER, *PROC_READERS)}
    for folder in ("tests", "benchmarks", "tools"):
        for root, _, names in os.walk(os.path.join(REPO, folder)):
            paths = [os.path.join(root, name) for name in names if name.endswith(".py")]
            sources.update({os.path.relpath(path, REPO): path for path in paths if path != os.path.abspath(__file__)})
    offending = [
        f"{name}:{number}"
        for name, path in sources.items()
        for number, line in enumerate(open(path).read().splitlines(), 1)
        if PER_PROCESS_PROC.search(line)
    ]
    assert offending == [], f"find and read other processes through {PROCESS_HELPER}"
    assert PER_PROCESS_PROC.search(open(_modules()[PROCESS_HELPER]).read())

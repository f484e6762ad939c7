"""The library by domain (docs/design.md "Layout"): facts and operations live in the module of their
domain, as in pyinfra's own facts/ and operations/ modules; the small cross-cutting modules hold
none beyond the one each exists for, so no grab-bag module collects them again."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

from pyinfra.api import FactBase

import sparkrig

# the domain modules: each holds its facts, operations and command builders
DOMAINS = {
    "node",  # the node report
    "fabric",  # the fabric phase: configs moved aside, links, RoCE devices, pings, rank env
    "fabricfacts",  # what a host says of its fabric: GID table, neighbours, ports, links
    "weights",  # weights state, fetch/copy/re-hash/serve
    "image",  # image names and state
    "imagecopy",  # the base image pulled on the head, saved, served, loaded on the workers
    "imagebuild",  # the patched image built, old images pruned
    "serving",  # the rank unit: container run and serve arguments, the smoke test's argv
    "bringup",  # the ordered start's beacon wait, the boot wait, the five gates
    "runningrank",  # the running rank's state; thawed, its peer down, a stale GID hand-over
    "front",  # the API front: nginx installed, its site and key include (docs/front.md)
    "owned",  # files, secrets, programs, directories and units sparkrig owns
    "release",  # the release and its record, stamped after the gates
    "rollback",  # the serving release kept and restored, the rollback decision
    "revisiondirs",  # the weights' revision directories: the old layout adopted, pruned
    "benchgate",  # the release's bench gate: the short bench against the previous figures
    "runtime",  # the NCCL, CUDA runtime and driver each rank's engine loaded, judged on the head
    "soakgate",  # the release's soak: concurrent load on the head, judged by the watchdog's rule
    "stackfiles",  # the stack's own files (a chat template): fetched by the head, mounted
    "pairsecret",  # the agents' secret and the API key on a rank
    "secretio",  # secrets written through stdin, judged by digest, relayed at apply time
    "status",  # status.py's one read per rank
    "baseline",  # kernel, driver, NIC firmware, BIOS, packages: read, compared, held, kho=off
    "ports",  # who listens on the ports a rank needs
    "reach",  # the head's reach of the Hub and the image registry it must download from
    "firewall",  # the table inet sparkrig: ruleset, unit, its state and drop counters
}
# cross-cutting modules and the one fact or operation each exists for
CROSS_CUTTING = {
    "stateread": {"HostState"},  # the one state read: the domain facts are its parts
    "hoststate": set(),  # assembles the domains' parts for the tasks
    "ordering": {"acting_where"},  # on_head/on_workers
    "failing": {"problems_absent"},  # fail a host with its reasons
}


def defined_in(module: object) -> set[str]:
    """The facts (FactBase subclasses) and pyinfra operations ``module`` itself defines."""
    name = getattr(module, "__name__", "")
    return {
        attr
        for attr, obj in vars(module).items()
        if getattr(obj, "__module__", None) == name
        and (
            (inspect.isclass(obj) and issubclass(obj, FactBase))
            or (callable(obj) and hasattr(obj, "_inner"))
        )
    }


def test_facts_and_operations_live_in_their_domain_module():
    found = {
        m.name: defined_in(importlib.import_module(f"sparkrig.{m.name}"))
        for m in pkgutil.iter_modules(sparkrig.__path__)
    }
    assert {"Node", "RoceGids", "WeightsState", "ImageState", "OwnedPaths"} <= set().union(
        *found.values()
    )  # the census sees facts at all
    stray = {
        module: sorted(names - CROSS_CUTTING.get(module, set()))
        for module, names in found.items()
        if module not in DOMAINS and names - CROSS_CUTTING.get(module, set())
    }
    assert stray == {}, f"facts or operations outside a domain module: {stray}"
    for module, allowed in CROSS_CUTTING.items():
        assert found[module] == allowed, module


# ---------------------------------------------------------------------------------------------
# One-way imports: the layers docs/design.md "Layout" draws
# ---------------------------------------------------------------------------------------------

LIBRARY = Path(sparkrig.__file__).resolve().parent
DESIGN = LIBRARY.parent / "docs" / "design.md"
LAYER_LINE = re.compile(r"^  layer (\d) +(\S+): +(.+)$")


def sparkrig_imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(module imported, at module level) of every ``sparkrig`` import of a module's tree:
    one inside a function or under ``if TYPE_CHECKING`` is not at module level."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module == "sparkrig":
                    names = [a.name for a in child.names if (LIBRARY / f"{a.name}.py").exists()]
                    names = names or ["__init__"]
                elif child.module.startswith("sparkrig."):
                    names = [child.module.split(".")[1]]
            elif isinstance(child, ast.Import):
                names = [a.name.split(".")[1] for a in child.names if a.name[:9] == "sparkrig."]
            found.extend((name, top) for name in names)
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            visit(child, top and not nested)

    visit(tree, True)
    return found


def import_graph(root: Path = LIBRARY) -> dict[str, set[str]]:
    """module -> the sparkrig modules it imports (at module level), for every module; a package
    (sparkrig/stacks/, sparkrig/bench/) is one module, importing what its files import."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[path.stem] = {m for m, _ in sparkrig_imports(tree)} - {path.stem, "__init__"}
    for package in sorted(p.parent for p in root.glob("*/__init__.py")):
        found = {
            m
            for path in sorted(package.rglob("*.py"))
            for m, _ in sparkrig_imports(ast.parse(path.read_text(), filename=str(path)))
        }
        graph[package.name] = found - {package.name, "__init__"}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or []."""
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        for dep in sorted(graph.get(module, ())):
            found = walk(dep, [*path, module])
            if found:
                return found
        done.add(module)
        return []

    for module in sorted(graph):
        found = walk(module, [])
        if found:
            return found
    return []


def drawn_layers(text: str) -> dict[str, int]:
    """module -> layer, from docs/design.md's layer picture ("  layer N name: module ...")."""
    layers: dict[str, int] = {}
    for line in text.splitlines():
        m = LAYER_LINE.match(line)
        if m:
            for module in m[3].split():
                layers[module.removesuffix(",")] = int(m[1])
    return layers


def test_no_sparkrig_import_hides_in_a_function_or_under_type_checking():
    hidden = {
        path.stem: sorted(m for m, top in sparkrig_imports(ast.parse(path.read_text())) if not top)
        for path in sorted(LIBRARY.glob("*.py"))
    }
    hidden = {module: names for module, names in hidden.items() if names}
    assert hidden == {}, f"sparkrig imports inside a function or under TYPE_CHECKING: {hidden}"


def test_the_library_has_no_import_cycle():
    graph = import_graph()
    assert {"stateread", "hoststate", "release", "config"} <= set(graph)  # it sees the modules
    assert "stateread" in graph["hoststate"]  # and their imports
    cycle = cycle_in(graph)
    assert cycle == [], f"import cycle: {' -> '.join(cycle)}"


def test_the_design_page_draws_every_module_in_a_layer_and_imports_only_go_down():
    graph = import_graph()
    layers = drawn_layers(DESIGN.read_text())
    drawn = "docs/design.md's layer picture lists other modules"
    assert set(layers) == set(graph) - {"__init__"}, drawn
    upward = {
        f"{module} (layer {layers[module]}) imports {dep} (layer {layers[dep]})"
        for module, deps in graph.items()
        if module in layers
        for dep in deps
        if layers[dep] > layers[module]
    }
    assert upward == set(), f"imports against docs/design.md's layers: {sorted(upward)}"
    # the state-reading machinery knows no domain; only the tasks read the assembled state
    assert all(layers[dep] == 0 for dep in graph["stateread"]), graph["stateread"]
    assert [m for m, deps in graph.items() if "hoststate" in deps] == []


def test_the_cycle_finder_finds_a_cycle_and_a_hidden_import():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) == []
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nfrom sparkrig.paths import paths\n"
        "if TYPE_CHECKING:\n    from sparkrig.owned import PathState\n"
        "def f():\n    from sparkrig import hostpkg\n"
    )
    assert sparkrig_imports(tree) == [("paths", True), ("owned", False), ("hostpkg", False)]


# ---------------------------------------------------------------------------------------------
# Operation names: the resource and its wanted state, as pyinfra names its operations
# ---------------------------------------------------------------------------------------------

# the last word of an operation's name: a past participle (regular ones end in "ed") or a state
PARTICIPLES = {"held", "kept", "built", "set", "proven", "written"}
STATES = {"present", "absent", "running", "serving", "off"}
# a first word that is an order, not a resource ("wait_for_ranks", "put_text")
VERBS = {"wait", "put", "prune", "displace", "run", "start", "stop", "install", "write", "ensure"}
# operations that wrap another operation, whose own name states the resource and its state
WRAPPERS = {"acting_where"}


def misnamed(name: str) -> str | None:
    """Why ``name`` is not ``<resource>_<wanted state>``, or None when it is."""
    words = name.split("_")
    if len(words) < 2:
        return "no resource and state (one word)"
    if words[0] in VERBS:
        return f"starts with the verb {words[0]!r}"
    last = words[-1]
    if not (last.endswith("ed") or last in PARTICIPLES or last in STATES):
        return f"ends in {last!r}, neither a past participle nor a state word"
    return None


def test_every_operation_names_its_resource_and_wanted_state():
    operations = {
        name
        for m in pkgutil.iter_modules(sparkrig.__path__)
        for name in defined_in(importlib.import_module(f"sparkrig.{m.name}"))
        if name[0].islower()  # facts are classes
    }
    assert {"file_present", "weights_present", "old_images_pruned"} <= operations  # it sees them
    wrong = {n: misnamed(n) for n in sorted(operations - WRAPPERS) if misnamed(n)}
    assert wrong == {}, f"operations not named <resource>_<wanted state>: {wrong}"


def test_the_name_check_rejects_an_action_and_a_noun():
    assert misnamed("put_text") == "starts with the verb 'put'"
    assert misnamed("service") == "no resource and state (one word)"
    assert misnamed("rank_env_file") == "ends in 'file', neither a past participle nor a state word"
    assert misnamed("rank_env_written") is None and misnamed("workers_running") is None

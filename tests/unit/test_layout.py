"""The library by domain (README "Layout"): facts and operations live in the module of their
domain, as in pyinfra's own facts/ and operations/ modules; the small cross-cutting modules hold
none beyond the one each exists for, so no grab-bag module collects them again."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from pyinfra.api import FactBase

import sparkrig

# the domain modules: each holds its facts, operations and command builders
DOMAINS = {
    "host",  # the node report
    "fabric",  # RoCE GID table, fabric configs, rank env file
    "weights",  # weights state, fetch/copy/re-hash/serve
    "image",  # image state, base pull/save/serve/load, patched build, prune
    "serving",  # boot and beacon waits, the four gates
    "owned",  # files, secrets, programs, directories and units sparkrig owns
    "release",  # release record, keep/restore, rollback
    "pairsecret",  # the agents' secret and the API key on a rank
    "status",  # status.py's one read per rank
    "baseline",  # kernel, driver, NIC firmware, BIOS, packages: read, compared, held, kho=off
}
# cross-cutting modules and the one fact or operation each exists for
CROSS_CUTTING = {
    "hoststate": {"HostState"},  # the one state read: the domain facts are its parts
    "ordering": {"acting_where"},  # on_head/on_workers
    "failhost": {"refuse"},  # fail a host with its reasons
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

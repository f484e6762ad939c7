"""sparkrig/config: hosts that name a ``pair`` form one cluster each (issue 52); the partition's
refusals name the host or the pair, and an inventory without ``pair`` stays one cluster."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.exceptions import DeployError

from sparkrig.config.inventory import InventoryView, build
from tests.unit.conftest import cluster


def two_pairs(**per_host: dict[str, Any]) -> InventoryView:
    """spark-0 (head) + spark-1 as pair_a, spark-2 (head) + spark-3 as pair_b, each its own
    subnet; ``per_host``: data to change on a host, by name."""
    hosts = dict(cluster(4).groups["head"] + cluster(4).groups["worker"])
    plan = {
        "spark-0": ("pair_a", "192.168.100.10/24"),
        "spark-1": ("pair_a", "192.168.100.11/24"),
        "spark-2": ("pair_b", "192.168.110.10/24"),
        "spark-3": ("pair_b", "192.168.110.11/24"),
    }
    data = {
        name: {
            **hosts[name],
            "pair": pair,
            "fabric_address": address,
            "lan_address": f"172.30.1.{11 + i}",  # the other pairs' fronts reach a head there
            **per_host.get(name, {}),
        }
        for i, (name, (pair, address)) in enumerate(plan.items())
    }
    return InventoryView(
        {
            "head": [(n, data[n]) for n in ("spark-0", "spark-2")],
            "worker": [(n, data[n]) for n in ("spark-1", "spark-3")],
        }
    )


def problems(view: InventoryView) -> str:
    with pytest.raises(DeployError) as err:
        build(view)
    return str(err.value)


def test_two_pairs_give_each_host_its_own_pairs_ranks_and_every_head():
    settings = build(two_pairs())
    a, b = settings["spark-1"], settings["spark-3"]
    assert (a.pair, b.pair) == ("pair_a", "pair_b")
    assert [r.name for r in a.ranks] == ["spark-0", "spark-1"]
    assert [r.name for r in b.ranks] == ["spark-2", "spark-3"]
    assert a.head.name == "spark-0" and b.head.name == "spark-2"
    assert [h.name for h in a.pair_heads] == ["spark-0", "spark-2"]
    assert [h.name for h in settings["spark-0"].other_heads] == ["spark-2"]


def test_a_single_cluster_inventory_has_no_pair_name():
    settings = build(cluster(4))
    assert {s.pair for s in settings.values()} == {""}
    assert [r.name for r in settings["spark-3"].ranks] == [f"spark-{i}" for i in range(4)]
    assert [h.name for h in settings["spark-1"].pair_heads] == ["spark-0"]
    assert settings["spark-0"].other_heads == ()


def test_a_host_without_a_pair_among_hosts_with_one_is_refused_naming_it():
    view = two_pairs(**{"spark-3": {"pair": None}})
    assert "spark-3: pair: missing: the other hosts name their pair; name this one's too" in (
        problems(view)
    )


def test_a_pair_with_two_heads_is_refused_naming_the_pair():
    view = two_pairs(**{"spark-2": {"pair": "pair_a"}, "spark-3": {"pair": "pair_a"}})
    two = "pair pair_a: group 'head' must hold exactly one host (rank 0), has spark-0, spark-2"
    assert two in problems(view)


def test_a_pair_without_a_worker_is_refused_naming_the_pair():
    view = two_pairs(**{"spark-3": {"pair": "pair_a"}})
    assert "pair pair_b: group 'worker' must hold at least one host (ranks 1..N-1)" in (
        problems(view)
    )


@pytest.mark.parametrize("name", ["head", "1x", "worker", "all", "pair-a"])
def test_a_bad_pair_name_is_refused_naming_the_host(name):
    view = two_pairs(**{"spark-2": {"pair": name}, "spark-3": {"pair": name}})
    said = problems(view)
    assert f"spark-2: pair: {name!r} is no pair name" in said
    assert f"spark-3: pair: {name!r} is no pair name" in said


def test_an_api_port_differing_between_heads_is_refused():
    view = two_pairs(**{"spark-2": {"api_port": 8443}, "spark-3": {"api_port": 8443}})
    assert "spark-2: api_port: 8443 differs from spark-0's 8000 (pair pair_a)" in problems(view)

"""Operating a pair over time (issue 11): the disk preflight honours a complete checkout."""

from __future__ import annotations

import json

from tests.plan import fakehosts
from tests.plan.test_plan import WORKER, acting, apply, converge_state, settings

GIB = 1024**3
SHORT = "10.0 GiB free under /var/lib/sparkrig/models, need 64.0 GiB"


def worker_disk_free(free: int) -> None:
    s = settings()[WORKER]
    report = fakehosts.node_report(
        mtu=9000,
        ipv4=s.me.fabric_address.with_prefixlen,
        swappiness=s.knobs.swappiness,
        min_free_kbytes=s.knobs.min_free_kbytes or 67584,
        disk_free=free,
    )
    fakehosts.inject("spark-b", {fakehosts.NODE: report})


def test_a_complete_checkout_needs_no_free_space_for_the_weights(monkeypatch):
    converge_state()
    worker_disk_free(10 * GIB)
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert SHORT not in r.output
    assert r.changed_ops == {}, r.changed_ops


def test_a_checkout_of_another_revision_still_needs_the_free_space(monkeypatch):
    converge_state()
    worker_disk_free(10 * GIB)
    stale = json.dumps({"ok": True, "commit": "0" * 40, "total_files": 2, "verified": 2,
                        "files_to_fetch": 0, "bytes_to_fetch": 0})  # fmt: skip
    fakehosts.inject("spark-b", {fakehosts.WEIGHTS_STATE: stale})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert SHORT in r.output
    assert not acting(r)

"""Lanes bound to interfaces in network namespaces: both source addresses reach the server,
policy routing, a dead lane, a bound one-lane copy. Needs root and `ip netns`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import lock_files, parts_in_flight, poll
from .topo import Topo, fetch_argv, serve_argv

pytestmark = pytest.mark.netns


@pytest.fixture
def topo() -> Iterator[Topo]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    with Topo("t") as t:
        yield t


def run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def fetch(topo: Topo, url: str, lock: Path, dest: Path, *extra: str) -> list[str]:
    return topo.fetch_cmd(
        *fetch_argv(lock, dest, url),
        "--uplink",
        "up0",
        "--uplink",
        "up1",
        "--progress-interval",
        "0.3",
        "--connect-timeout",
        "2",
        "--read-timeout",
        "2",
        "--backoff",
        "0.2",
        *extra,
    )


def complete(lock: Path, dest: Path) -> bool:
    return all(
        (dest / f["path"]).exists() and (dest / f["path"]).stat().st_size == f["size"]
        for f in lock_files(lock)
    )


def test_routes_idempotent(topo: Topo) -> None:
    routes = topo.fetch_cmd("routes", "--uplink", "up0", "--uplink", "up1")
    check = run(routes + ["--check"])
    plan = json.loads(check.stdout)
    assert plan["changed"] and not plan["applied"]
    assert "ip rule add from 10.213.2.2 lookup 102 pref 1002" in plan["commands"]
    assert run(topo.in_ns(topo.cli, "ip", "rule", "show")).stdout.count("lookup 10") == 0
    first = json.loads(run(routes).stdout)
    assert first["changed"] and first["applied"]
    rules = run(topo.in_ns(topo.cli, "ip", "rule", "show")).stdout
    assert "from 10.213.1.2 lookup 101" in rules and "from 10.213.2.2 lookup 102" in rules
    table = run(topo.in_ns(topo.cli, "ip", "route", "show", "table", "102")).stdout
    assert "default via 10.213.2.1 dev up1" in table
    # a LAN neighbour's answers from the uplink address stay on the LAN (issue 35's stranger)
    assert "10.213.2.0/24 dev up1 scope link src 10.213.2.2" in table
    assert json.loads(run(routes).stdout)["changed"] is False
    # a DHCP address change: the stale rule is replaced, not duplicated
    run(topo.in_ns(topo.cli, "ip", "addr", "del", "10.213.2.2/24", "dev", "up1"))
    run(topo.in_ns(topo.cli, "ip", "addr", "add", "10.213.2.3/24", "dev", "up1"))
    run(
        topo.in_ns(
            topo.cli,
            "ip",
            "route",
            "replace",
            "default",
            "via",
            "10.213.2.1",
            "dev",
            "up1",
            "metric",
            "600",
        )
    )
    again = json.loads(run(routes).stdout)
    assert again["changed"]
    rules = run(topo.in_ns(topo.cli, "ip", "rule", "show")).stdout
    assert "from 10.213.2.3 lookup 102" in rules and "10.213.2.2" not in rules


def test_repair_fixes_an_old_fetchs_tables_and_adds_none_elsewhere(topo: Topo) -> None:
    routes = topo.fetch_cmd("routes", "--uplink", "up0", "--uplink", "up1")
    untouched = json.loads(run(routes + ["--repair"]).stdout)
    assert untouched["commands"] == []  # no fetch ran here: no policy routing added
    assert "lookup 10" not in run(topo.in_ns(topo.cli, "ip", "rule", "show")).stdout
    # what an older fetch left: the rules and a default per table, no subnet route
    for n, gw in ((1, "10.213.1.1"), (2, "10.213.2.1")):
        run(topo.in_ns(topo.cli, "ip", "route", "replace", "default", "via", gw, "dev",
                       f"up{n - 1}", "table", f"10{n}"))  # fmt: skip
        run(topo.in_ns(topo.cli, "ip", "rule", "add", "from", f"10.213.{n}.2", "lookup",
                       f"10{n}", "pref", f"100{n}"))  # fmt: skip
    repaired = json.loads(run(routes + ["--repair"]).stdout)
    assert repaired["changed"] and repaired["applied"]
    table = run(topo.in_ns(topo.cli, "ip", "route", "show", "table", "101")).stdout
    assert "10.213.1.0/24 dev up0 scope link src 10.213.1.2" in table
    assert json.loads(run(routes + ["--repair"]).stdout)["changed"] is False


def test_two_lanes_both_sources_seen(
    topo: Topo, hub_root: Path, model_lock: Path, tmp_path: Path
) -> None:
    """The fetch installs the policy routes itself (--install-routes), then both lanes work."""
    url = topo.start_hub(hub_root)
    topo.control("faults", {"path": "*", "throttle_bps": 3_000_000}, "POST")
    dest = tmp_path / "m"
    r = run(fetch(topo, url, model_lock, dest, "--install-routes"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "routes: ip rule add from 10.213.2.2 lookup 102 pref 1002" in r.stdout
    rules = run(topo.in_ns(topo.cli, "ip", "rule", "show")).stdout
    assert "from 10.213.1.2 lookup 101" in rules and "from 10.213.2.2 lookup 102" in rules
    assert complete(model_lock, dest)
    log = topo.control("log")
    clients = {x["client"] for x in log}
    assert clients == {"10.213.1.2", "10.213.2.2"}
    status = json.loads((tmp_path / "m.fetch-status.json").read_text())
    assert status["lanes"]["up0"]["files"] > 0 and status["lanes"]["up1"]["files"] > 0
    assert status["lanes"]["up0"]["bytes"] + status["lanes"]["up1"]["bytes"] == sum(
        f["size"] for f in lock_files(model_lock)
    )


def test_device_binding_needs_policy_table(
    topo: Topo, hub_root: Path, model_lock: Path, tmp_path: Path
) -> None:
    """Only up0 has a main-table default: lane up1 cannot connect until the routes mode
    installs table 102 (docs/weights.md); with it, up1 carries traffic."""
    url = topo.start_hub(hub_root)
    run(topo.in_ns(topo.cli, "ip", "route", "del", "default", "dev", "up1"))
    one_lane = [a if a != "up0" else "up1" for a in fetch(topo, url, model_lock, tmp_path / "a")]
    one_lane = (
        one_lane[: one_lane.index("--uplink", one_lane.index("--uplink") + 1)]
        + one_lane[one_lane.index("--uplink", one_lane.index("--uplink") + 1) + 2 :]
    )
    before = run(one_lane + ["--lane-failures", "1", "--max-file-attempts", "1"])
    assert before.returncode == 1
    r = run(topo.fetch_cmd("routes", "--uplink", "up1", "--gateway", "up1=10.213.2.1"))
    assert json.loads(r.stdout)["changed"]
    after = run(one_lane)
    assert after.returncode == 0, after.stdout + after.stderr
    assert {x["client"] for x in topo.control("log")} == {"10.213.2.2"}


def test_dead_lane_other_lane_finishes(
    topo: Topo, hub_root: Path, model_lock: Path, tmp_path: Path
) -> None:
    url = topo.start_hub(hub_root)
    run(topo.fetch_cmd("routes", "--uplink", "up0", "--uplink", "up1"))
    topo.control("faults", {"path": "*", "throttle_bps": 2_000_000}, "POST")
    dest = tmp_path / "m"
    p = subprocess.Popen(
        fetch(topo, url, model_lock, dest, "--lane-failures", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    topo.procs.append(p)
    poll(lambda: len(parts_in_flight(dest)) >= 2, "both lanes mid-file on the two shards")
    topo.blackhole(1)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    assert complete(model_lock, dest)
    status = json.loads((tmp_path / "m.fetch-status.json").read_text())
    up0, up1 = status["lanes"]["up0"], status["lanes"]["up1"]
    assert up1["failures"] >= 1 and "back to the queue" in out
    assert up0["files"] + up1["files"] == 8
    # up1 retires after 2 failures in a row, unless the queue was empty when it came back from
    # its first backoff (up0 had taken its file): then it simply ends
    if up1["state"] == "retired":
        assert "retired after 2 failures" in out
    else:
        assert up1["state"] == "done" and up1["failures"] == 1
    # the file up1 had started was resumed by up0 from its .part
    resumed = [
        x
        for x in topo.control("log")
        if x["client"] == "10.213.1.2" and (x["range"] or "").startswith("bytes=")
    ]
    assert resumed, out


def test_bound_one_lane_copy(topo: Topo, hub_root: Path, model_lock: Path, tmp_path: Path) -> None:
    """The fabric copy: serve on the server side's link address, bound to that device; the
    receiving side pulls over one lane bound to its interface and verifies on arrival."""
    src = tmp_path / "src"
    url = topo.start_hub(hub_root)
    assert run(fetch(topo, url, model_lock, src)).returncode == 0
    srv = subprocess.Popen(
        topo.in_ns(
            topo.srv,
            # the program and its argv without the client's namespace prefix
            *topo.fetch_cmd(
                *serve_argv(src, f"{topo.dn_ip(0)}:9100", model_lock, "--bind-device", "dn0")
            )[4:],
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    topo.procs.append(srv)
    listening = topo.in_ns(topo.srv, "ss", "-Hltn", "sport = :9100")
    poll(lambda: bool(subprocess.run(listening, capture_output=True, text=True).stdout), "serve")
    dst = tmp_path / "dst"
    r = run(
        topo.fetch_cmd(
            "fetch",
            "--lock",
            str(model_lock),
            "--dest",
            str(dst),
            "--base-url",
            f"http://{topo.dn_ip(0)}:9100/",
            "--uplink",
            "up0",
            "--progress-interval",
            "0.3",
        )
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert complete(model_lock, dst)
    srv.terminate()
    _, err = srv.communicate(timeout=10)
    assert err.count("10.213.1.2 ") >= 8 and "10.213.2.2" not in err

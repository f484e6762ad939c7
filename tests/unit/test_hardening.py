"""Least privilege (issue 35 item 6): the rank container's capabilities, no-new-privileges and
pids limit, and the systemd sandbox of sparkrig's units (checked by systemd-analyze when the
machine has it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkrig import firewall
from sparkrig.config.inventory import build
from sparkrig.config.model import Settings
from sparkrig.fabric import relay_unit_text
from sparkrig.hardening import container_args, unit_hardening
from sparkrig.helperunits import (
    agent_unit_context,
    pair_unit_context,
    supervisor_unit_context,
    watchdog_unit_context,
)
from sparkrig.render import render
from sparkrig.serving import docker_run_args, rank_unit_context, smoke_run_args, weights_id
from tests.unit.conftest import cluster
from tests.unit.test_rings import ring_settings


def ranks(**knobs: object) -> list[Settings]:
    built = build(cluster(2, **knobs))
    return [built["spark-0"], built["spark-1"]]


def caps(argv: list[str]) -> tuple[list[str], list[str]]:
    drop = [argv[i + 1] for i, a in enumerate(argv) if a == "--cap-drop"]
    add = [argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"]
    return drop, add


def test_the_rank_drops_every_capability_but_ipc_lock():
    for s in ranks():
        for argv in (docker_run_args(s), smoke_run_args(s, "img")):
            assert caps(argv) == (["ALL"], ["IPC_LOCK"])
            i = argv.index("--security-opt")
            assert argv[i + 1] == "no-new-privileges"
            assert argv[argv.index("--pids-limit") + 1] == "4096"


def test_a_privileged_port_adds_net_bind_service_only():
    """The engine binds engine_port inside the container (host network); api_port is the
    front's (nginx, outside it): 443 there gives the container nothing more (issue 48)."""
    s = ranks(engine_port=443)[0]
    assert caps(container_args(s)) == (["ALL"], ["IPC_LOCK", "NET_BIND_SERVICE"])
    assert caps(container_args(ranks(api_port=443)[0])) == (["ALL"], ["IPC_LOCK"])


def test_the_pids_limit_is_the_knob():
    s = ranks(container_pids_limit=8192)[0]
    assert container_args(s)[-2:] == ["--pids-limit", "8192"]


def units(s: Settings) -> dict[str, str]:
    out = {
        f"{s.unit_name}.service": render(
            "sparkrig-rank.service.j2", **rank_unit_context(s, s.image_ref, weights_id(s))
        ),
        f"sparkrig-pair-{s.me.rank}.service": render(
            "sparkrig-pair.service.j2", **pair_unit_context(s)
        ),
    }
    if s.me.is_head:
        out["sparkrig-watchdog.service"] = render(
            "sparkrig-watchdog.service.j2", **watchdog_unit_context(s)
        )
        out["sparkrig-supervisor.service"] = render(
            "sparkrig-supervisor.service.j2", **supervisor_unit_context(s)
        )
    else:
        out["sparkrig-agent.service"] = render("sparkrig-agent.service.j2", **agent_unit_context(s))
    return out


def directives(text: str) -> dict[str, list[str]]:
    got: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            got.setdefault(key, []).append(value)
    return got


def test_every_helper_unit_is_sandboxed_with_an_address_allow_list():
    head, worker = ranks()
    for s in (head, worker):
        for name, text in units(s).items():
            d = directives(text)
            assert d["NoNewPrivileges"] == ["yes"] and d["PrivateTmp"] == ["yes"], name
            assert d["RuntimeDirectory"] == ["sparkrig"], name
            assert d["RuntimeDirectoryPreserve"] == ["yes"], name
            assert "TasksMax" in d and "LimitNOFILE" in d, name
            if name.startswith(s.unit_name):  # the rank: docker CLI, no IP filter
                assert d["ProtectSystem"] == ["full"] and "IPAddressDeny" not in d
                continue
            assert d["ProtectSystem"] == ["strict"], name
            assert d["IPAddressDeny"] == ["any"], name
            allowed = d["IPAddressAllow"][0].split()
            assert {"192.168.100.10/32", "192.168.100.11/32"} <= set(allowed), name
            assert ("localhost" in allowed) is (name == "sparkrig-watchdog.service"), name
            assert d["LimitNOFILE"] == ["4096"] and d["TasksMax"] == ["256"], name


def netfilter_units() -> dict[str, str]:
    relay = relay_unit_text(ring_settings(4)["spark-0"])
    assert relay is not None
    return {"sparkrig-firewall.service": firewall.unit(ranks()[0]), "sparkrig-relay.service": relay}


def test_no_unit_may_hold_a_capability_it_does_not_name():
    """Root by its uid alone: the helpers and the rank own every file and socket they use (the
    docker socket, /proc/sys/vm, /run/sparkrig, the secrets); nft and iptables need
    CAP_NET_ADMIN for netlink's ruleset changes (docs/hardening.md)."""
    for s in ranks():
        for name, text in units(s).items():
            d = directives(text)
            assert d["CapabilityBoundingSet"] == [""], name
            assert d["AmbientCapabilities"] == [""], name
    for name, text in netfilter_units().items():
        d = directives(text)
        assert d["CapabilityBoundingSet"] == ["CAP_NET_ADMIN"], name
        assert d["AmbientCapabilities"] == [""], name
        assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_NETLINK"], name
        assert d["IPAddressDeny"] == ["any"] and "IPAddressAllow" not in d, name


def test_a_helper_listening_below_1024_may_bind_there_and_nothing_more():
    head, worker = ranks(pair_port=600)
    assert directives(units(head)["sparkrig-pair-0.service"])["CapabilityBoundingSet"] == [
        "CAP_NET_BIND_SERVICE"
    ]
    assert directives(units(worker)["sparkrig-agent.service"])["CapabilityBoundingSet"] == [""]
    head, worker = ranks(agent_port=601)
    for s, name in ((head, "sparkrig-supervisor.service"), (worker, "sparkrig-agent.service")):
        assert directives(units(s)[name])["CapabilityBoundingSet"] == ["CAP_NET_BIND_SERVICE"]
    assert directives(units(head)["sparkrig-pair-0.service"])["CapabilityBoundingSet"] == [""]
    assert directives(units(head)["sparkrig-watchdog.service"])["CapabilityBoundingSet"] == [""]


def test_the_rank_keeps_the_gpu_nodes_and_proc_sys_its_start_gate_uses():
    """sparkhost prep asks nvidia-smi for GPU processes (the GPU's device nodes: no
    PrivateDevices, and no ProtectClock, whose DeviceAllow=char-rtc closes every other node)
    and drops the page cache through /proc/sys/vm (no ProtectKernelTunables); the helpers use
    neither."""
    always = ("ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
              "ProtectHostname", "RestrictNamespaces", "LockPersonality",
              "MemoryDenyWriteExecute", "NoNewPrivileges")  # fmt: skip
    gpu = ("PrivateDevices", "ProtectKernelTunables", "ProtectClock")
    for s in ranks():
        for name, text in units(s).items():
            d = directives(text)
            assert all(d[key] == ["yes"] for key in always), name
            if name == f"{s.unit_name}.service":
                assert not any(key in d for key in gpu), name
            else:
                assert all(d[key] == ["yes"] for key in gpu), name
                assert d["SystemCallFilter"] == ["@system-service"], name


def test_unknown_unit_kind_is_refused():
    with pytest.raises(ValueError):
        unit_hardening(ranks()[0], "nginx")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_rendered_units_pass_systemd_analyze_verify(tmp_path: Path):
    head, worker = ranks()
    files = []
    for name, text in {**units(head), **units(worker), **netfilter_units()}.items():
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
    r = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", *files],
        capture_output=True,
        text=True,
        timeout=120,
        env={"SYSTEMD_LOG_LEVEL": "warning", "PATH": "/usr/bin:/bin"},
    )
    # this machine has no docker binary and no real units around: only those complaints pass
    lines = [
        line
        for line in (r.stdout + r.stderr).splitlines()
        if line.strip()
        and "/usr/bin/docker is not executable" not in line
        and "Failed to prepare filename" not in line
    ]
    assert lines == [], lines

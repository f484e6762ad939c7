"""The ports part's script, run by a real shell and the real ``ss`` on this machine, and the
verdict on who may hold a port sparkrig needs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from sparkrig.factlines import END
from sparkrig.ports import Listener, Listeners, parse_listeners


def listeners_of(*ports: int):
    fact = Listeners()
    command = fact.command(ports=ports).get_raw_value()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return fact.process(done.stdout.splitlines())


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_listener_is_reported_with_its_process_and_a_free_port_not_at_all():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with socket.socket() as free:  # bound, not listening: nothing holds it for ss -l
            free.bind(("127.0.0.1", 0))
            other = free.getsockname()[1]
            report = listeners_of(port, other)
    assert report.checked
    (held,) = report.listeners
    assert (held.port, held.address, held.pid) == (port, "127.0.0.1", os.getpid())
    assert held.program and held.program in open(f"/proc/{os.getpid()}/comm").read()


def test_sparkrigs_own_units_and_containers_hold_its_ports_and_nothing_else_does():
    scope = "/system.slice/docker-" + "ab" * 32 + ".scope"
    ours = [
        Listener(8000, "*", 1, "vllm", scope, container="sparkrig-rank0"),
        Listener(29600, "10.0.0.1", 2, "python3", "/system.slice/sparkrig-pair.service"),
    ]
    theirs = [
        Listener(8000, "*", 3, "node", scope, container="open-webui"),
        Listener(29600, "*", 4, "python3", "/user.slice/user-1000.slice/session-2.scope"),
        Listener(29600, "*"),  # ss named no process
    ]
    assert all(x.sparkrigs for x in ours) and not any(x.sparkrigs for x in theirs)
    assert theirs[2].holder() == "a process ss does not name"
    assert theirs[1].holder() == "python3 (pid 4, session-2.scope)"


def test_the_report_parses_what_the_script_prints():
    lines = [f"listen=[::1]:8000|12|vllm|/docker/{'cd' * 32}|sparkrig-rank0", END]
    (held,) = parse_listeners(lines).listeners
    assert (held.port, held.address, held.container) == (8000, "[::1]", "sparkrig-rank0")
    assert not parse_listeners(["ss=missing", END]).checked


def test_nginx_holds_api_port_as_the_front_and_nothing_else_on_the_head():
    from conftest import cluster

    from sparkrig.config.inventory import build
    from sparkrig.ports import PortsReport, needed_ports, port_problems

    head = build(cluster(2))["spark-0"]
    assert needed_ports(head)[8001] == "engine_port"
    nginx = "/system.slice/nginx.service"
    report = PortsReport(True, (Listener(8000, "0.0.0.0", 10, "nginx", nginx),))
    assert port_problems(head, report) == []  # the API front (sparkrig/front.py)
    report = PortsReport(True, (Listener(8001, "0.0.0.0", 10, "nginx", nginx),))
    assert (
        "port 8001 (engine_port) is held by nginx (pid 10, nginx.service)"
        in port_problems(head, report)[0]
    )
    other = PortsReport(True, (Listener(8000, "0.0.0.0", 11, "python3", "/user.slice/x.scope"),))
    assert "port 8000 (api_port)" in port_problems(head, other)[0]

"""The pair helpers bound to the fabric netdev (files/sparkhost: ``--bind-device``): their
listeners answer only what arrives on that device, so a stranger's connection to the fabric
address that came in on the uplink is refused (network namespaces: tests/unit/test_firewall.py
``Lan``), and their client sockets are bound before they connect. The host's own connection to
its fabric address (through lo) is still answered: the kernel counts it as arriving on the
device that holds the address."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sparkhost import common, pair
from sparkhost.helperhttp import GuardedServer

from tests.unit.test_firewall import ROOT_NETNS, Lan

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from sparkhost import pair
    from sparkhost.helperhttp import GuardedServer

    device = sys.argv[2]
    pair.Beacon.container, pair.Beacon.running = "rank0", True
    server = pair.beacon_server(pair.beacon_sockets("192.168.100.10:29600", device)[0])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    GuardedServer.device = device
    agent = GuardedServer(("192.168.100.10", 29601), pair.Agent)
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    print("ready", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def net() -> Iterator[Lan]:
    if not ROOT_NETNS:
        pytest.skip("needs root, iproute2 and nft")
    with Lan() as topology:
        yield topology


def serve_in(lan: Lan, device: str) -> None:
    """The beacon and an agent on the rank's fabric address, bound to ``device`` ("": none)."""
    lan.listener = subprocess.Popen(
        ["ip", "netns", "exec", lan.rank, sys.executable, "-c", SCRIPT, str(ROOT / "files"),
         device],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert lan.listener.stdout is not None and lan.listener.stdout.readline() == "ready\n"


@pytest.mark.parametrize("device", ["", "enp1s0f1np1"])
def test_bound_listeners_answer_the_fabric_only(net: Lan, device: str) -> None:
    lan = net
    serve_in(lan, device)
    for port in (29600, 29601):
        assert lan.reaches(lan.peer, "192.168.100.10", port)  # on the fabric
        # a stranger with a route to the fabric subnet through the uplink: the weak host model
        # answers it unless the listener is bound to the fabric netdev
        assert lan.reaches(lan.stranger, "192.168.100.10", port) == (not device)


def test_client_sockets_are_bound_before_they_connect(monkeypatch) -> None:
    """An opener bound to a netdev that does not exist fails at the bind (ENODEV), before any
    packet is sent; bound to lo it reaches a server on loopback."""
    server = GuardedServer(("127.0.0.1", 0), pair.Agent)
    import threading

    monkeypatch.setattr(pair.Agent, "unit", "sparkrig-worker.service")
    monkeypatch.setattr(pair, "docker_state", lambda: "")
    monkeypatch.setattr(pair, "read_flag", lambda _: "")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/ready"
    try:
        with common.device_opener("lo").open(url, timeout=5) as r:
            assert r.status == 200
        with pytest.raises(OSError) as err:
            common.device_opener("nosuchdev0").open(url, timeout=5)
        assert "No such device" in str(err.value)
    finally:
        server.shutdown()
        server.server_close()


def test_use_device_binds_every_listener_and_urlopen(monkeypatch) -> None:
    monkeypatch.setattr(GuardedServer, "device", "")
    installed = []
    monkeypatch.setattr(urllib.request, "install_opener", installed.append)
    pair.use_device("")
    assert GuardedServer.device == "" and not installed
    pair.use_device("enp1s0f1np1")
    assert GuardedServer.device == "enp1s0f1np1" and len(installed) == 1

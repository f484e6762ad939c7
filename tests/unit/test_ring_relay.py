"""A ring of four relays its diagonals (docs/rings.md), proven in network namespaces: four
"Sparks" cabled as the plan says (one veth per function of each cable, DGX OS's netdev names),
each given its planned addresses and routes, the rendered sysctl.d file, the rendered firewall,
docker's FORWARD chain (policy DROP, a jump to DOCKER-USER) and the rendered relay unit's
commands. Rank 0 then reaches a pair port of rank 2, the rank it has no cable to, at the address
the helpers use, with a full-MTU don't-fragment ping and a TCP connection; without the relay
unit's rules the same connection fails (docker's policy drops the relay)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkrig import firewall
from sparkrig.config.model import Settings
from sparkrig.fabric import forwarding_text, relay_unit_text
from tests.unit.test_rings import ring_settings

TOOLS = ("ip", "nft", "iptables", "ping", "sysctl")
READY = os.geteuid() == 0 and all(shutil.which(t) for t in TOOLS)
pytestmark = pytest.mark.skipif(not READY, reason=f"needs root and {', '.join(TOOLS)}")


def sh(ns: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", command], check=check,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def unit_lines(unit: str, key: str) -> list[str]:
    """The commands of ``key=`` lines of a unit (a leading ``-`` dropped)."""
    return [line.split("=", 1)[1].lstrip("-") for line in unit.splitlines() if line.startswith(key)]


@pytest.fixture(params=[4])
def ring(request) -> Iterator[tuple[list[str], dict[str, Settings]]]:
    """A ring of four (``request.param``: 3, a triangle) in network namespaces."""
    n = request.param
    settings = ring_settings(n)
    names = [f"srr{os.getpid() % 10000}-{r}" for r in range(n)]
    by_rank = sorted(settings.values(), key=lambda s: s.me.rank)
    try:
        for ns in names:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        tmp = Path(tempfile.mkdtemp(prefix="sparkrig-relay-"))
        for s, ns in zip(by_rank, names, strict=True):
            part = s.fabric_rank
            assert part is not None
            sh(ns, "ip link set lo up; sysctl -qw net.ipv4.conf.all.forwarding=0 "
                   "net.ipv4.conf.all.rp_filter=2")  # fmt: skip  # Ubuntu's loose default
            for i in part.ifaces:  # each cable once, from its port-0 end
                if i.port != 0:
                    continue
                a, b = f"sra{os.getpid() % 10000}", f"srb{os.getpid() % 10000}"
                peer_ns = names[i.peer]
                subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b],
                               check=True)  # fmt: skip
                subprocess.run(["ip", "link", "set", a, "netns", ns, "name", i.netdev], check=True)
                subprocess.run(["ip", "link", "set", b, "netns", peer_ns, "name", i.peer_netdev],
                               check=True)  # fmt: skip
        for s, ns in zip(by_rank, names, strict=True):
            part = s.fabric_rank
            assert part is not None
            for i in part.ifaces:
                sh(ns, f"ip link set {i.netdev} mtu {s.knobs.fabric_mtu} up; "
                       f"ip addr add {i.address.with_prefixlen} dev {i.netdev}")  # fmt: skip
            for r in part.routes:
                sh(ns, f"ip route add {r.to} via {r.via} dev {r.dev}")
            sysctl = forwarding_text(s)
            assert (sysctl is not None) == (n == 4)  # every rank of a ring of four relays
            if sysctl is not None:
                (tmp / f"{ns}.conf").write_text(sysctl)
                sh(ns, f"sysctl -q -p {tmp / f'{ns}.conf'}")
            (tmp / f"{ns}.nft").write_text(firewall.ruleset(s))
            sh(ns, f"nft -f {tmp / f'{ns}.nft'}")
            # docker's chains as dockerd leaves them: FORWARD drops, DOCKER-USER first
            sh(ns, "iptables -N DOCKER-USER; iptables -A FORWARD -j DOCKER-USER; "
                   "iptables -A DOCKER-USER -j RETURN; iptables -P FORWARD DROP")  # fmt: skip
        yield names, settings
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def listen(ns: str, port: int) -> subprocess.Popen[str]:
    code = (
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        f"s.bind(('0.0.0.0',{port}))\ns.listen()\nprint('up',flush=True)\n"
        "while True:\n c,_=s.accept()\n c.sendall(b'rank2')\n c.close()\n"
    )
    p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "up"
    return p


def connects(ns: str, address: str, port: int) -> bool:
    code = (
        f"import socket\nc=socket.create_connection(('{address}',{port}),timeout=3)\n"
        "assert c.recv(5)==b'rank2'"
    )
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                          capture_output=True, timeout=30).returncode == 0  # fmt: skip


def test_rank_0_reaches_rank_2_through_a_neighbour_only_with_the_relay_rules(ring) -> None:
    names, settings = ring
    s0 = settings["spark-0"]
    part = s0.fabric_rank
    assert part is not None
    far = str(part.peer_addresses[2])  # the address rank 0's helpers use for rank 2
    port = s0.knobs.pair_port  # the beacon's: dropped off the fabric, accepted from a peer
    server = listen(names[2], port)
    try:
        # docker's FORWARD policy drops the relay: nothing crosses before the unit's rules
        assert not connects(names[0], far, port)
        units = {}
        for s in settings.values():
            unit = relay_unit_text(s)
            assert unit is not None
            units[s.me.rank] = unit
            for command in unit_lines(unit, "ExecStart="):
                sh(names[s.me.rank], command)
                sh(names[s.me.rank], command)  # a second start (docker restarted) adds nothing
        rules = sh(names[1], "iptables -S DOCKER-USER").stdout
        assert rules.count("sparkrig-relay") == 4, rules
        mtu = s0.knobs.fabric_mtu
        ping = sh(names[0], f"ping -M do -s {mtu - 28} -c 2 -W 2 {far}", check=False)
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert connects(names[0], far, port)
        # the unit's stop takes its rules out again, and the relay with them
        for rank, unit in units.items():
            for command in unit_lines(unit, "ExecStop="):
                sh(names[rank], command)
        assert "sparkrig-relay" not in sh(names[1], "iptables -S DOCKER-USER").stdout
        assert not connects(names[0], far, port)
    finally:
        server.kill()
        server.wait()


SOURCE = Path(__file__).resolve().parents[2] / "files" / "sparkhost"


def rendered_command(s: Settings, template: str, context: dict, job: str) -> str:
    """The ``sparkhost pair <job>`` line of a rendered unit, run from this checkout's package."""
    from sparkrig import hostpkg
    from sparkrig.render import render

    unit = render(template, **context)
    line = next(x for x in unit.splitlines() if f" pair {job} " in x)
    command = line.split("=", 1)[1]
    return command.replace(" ".join(hostpkg.invocation(s.knobs.install_dir)),
                           f"{sys.executable} {SOURCE}")  # fmt: skip


@pytest.mark.parametrize("ring", [3, 4], indirect=True)
def test_the_rendered_helpers_of_a_ring_reach_every_peer_and_the_heads_gate_passes(ring) -> None:
    """Each rank's beacon as its rendered pair unit runs it (listening on every address a peer
    dials it at, no netdev bound), with the relay unit's rules in place on a ring of four: the
    head's start gate as its rendered rank unit runs it sees every worker up (on a ring of four
    rank 2 through a neighbour; on a triangle, where no route leads to a peer's address on
    another cable, each at its end of the cable they share), and no watch stops its rank."""
    from sparkrig.helperunits import pair_unit_context
    from sparkrig.serving import rank_unit_context

    names, settings = ring
    tmp = Path(tempfile.mkdtemp(prefix="sparkrig-ring-helpers-"))
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\necho true\n")  # the container runs
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp}/systemctl.log\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    secret = tmp / "pair-token"
    secret.write_text("0123456789abcdef" * 3 + "\n")
    for s in settings.values():
        for command in unit_lines(relay_unit_text(s) or "", "ExecStart="):
            sh(names[s.me.rank], command)
    watches = []
    try:
        for s in settings.values():
            command = rendered_command(s, "sparkrig-pair.service.j2", pair_unit_context(s),
                                       "watch")  # fmt: skip
            env = f"env PATH={bin_dir}:$PATH SPARKRIG_RUN_DIR={tmp}/run{s.me.rank}"
            watches.append(subprocess.Popen(
                ["ip", "netns", "exec", names[s.me.rank], "sh", "-c", f"exec {env} {command}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            ))  # fmt: skip
        head = settings["spark-0"]
        gate = rendered_command(
            head, "sparkrig-rank.service.j2", rank_unit_context(head, "img", "w"), "wait"
        ).replace(str(head.knobs.pair_grace_s), "60", 1)
        gate = gate.replace(" --token-file /etc/sparkrig/pair-token", f" --token-file {secret}")
        done = sh(names[0], f"env SPARKRIG_RUN_DIR={tmp}/gate {gate}", check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        said = done.stdout + done.stderr
        workers = [head.dial(r) for r in head.workers]
        assert "every peer is up" in said and all(w in said for w in workers), said
        assert head.fabric_rank is not None
        assert str(head.fabric_rank.peer_addresses[2]) in workers  # rank 2: across, or direct
        assert not (tmp / "systemctl.log").exists()  # no watch stopped its rank
    finally:
        for w in watches:
            w.kill()
            w.wait()


@pytest.fixture
def lan() -> Iterator[dict[str, str]]:
    """The LAN of a triangle in network namespaces, one bridge: the head (192.168.1.10), a
    worker (.11, a rank's lan_address) and a stranger (.250)."""
    tag = str(os.getpid() % 10000)
    ns = {role: f"srl{tag}{role[0]}" for role in ("head", "worker", "stranger", "bridge")}
    addresses = {"head": "192.168.1.10", "worker": "192.168.1.11", "stranger": "192.168.1.250"}
    try:
        for name in ns.values():
            subprocess.run(["ip", "netns", "add", name], check=True)
        sh(ns["bridge"], "ip link add br0 type bridge; ip link set br0 up")
        for i, role in enumerate(("head", "worker", "stranger")):
            subprocess.run(["ip", "link", "add", f"srl{tag}v{i}", "netns", ns[role], "type",
                            "veth", "peer", "name", f"p{i}", "netns", ns["bridge"]],
                           check=True)  # fmt: skip
            sh(ns["bridge"], f"ip link set p{i} master br0 up")
            sh(ns[role], f"ip link set lo up; ip link set srl{tag}v{i} name enP7s7")
            sh(ns[role], f"ip addr add {addresses[role]}/24 dev enP7s7; ip link set enP7s7 up")
        yield ns
    finally:
        for name in ns.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_the_heads_rendezvous_is_reached_from_the_ranks_lan_addresses_only(lan) -> None:
    """A triangle meets at the head's LAN address (TensorFold's TP>2 rule): with the head's
    rendered firewall loaded, a worker's LAN address reaches the rendezvous ports (torch's
    TCPStore listens on the wildcard) and a stranger on the same LAN does not; a pair's
    firewall, which has no LAN rule, lets no worker in either."""
    from tests.unit.test_firewall import CONNECT, LISTEN

    head = ring_settings(3)["spark-0"]
    ports = [head.knobs.master_port, head.knobs.master_port + 1]
    assert head.rendezvous_ip == "192.168.1.10"  # test_rings' lan_address of the head
    listener = subprocess.Popen(
        ["ip", "netns", "exec", lan["head"], sys.executable, "-c", LISTEN, *map(str, ports)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "ready\n"
        tmp = Path(tempfile.mkdtemp(prefix="sparkrig-ring-lan-"))

        def reaches(role: str, port: int) -> bool:
            done = subprocess.run(
                ["ip", "netns", "exec", lan[role], sys.executable, "-c", CONNECT,
                 "192.168.1.10", str(port)], capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            return done.stdout.startswith("open")

        ring = firewall.ruleset(head)
        # the same table without the LAN rule: what a pair's head has
        rendezvous = [x for x in ring.splitlines(keepends=True)
                      if x.strip().startswith("tcp dport {") and "ip saddr {" in x]  # fmt: skip
        pair = "".join(x for x in ring.splitlines(keepends=True) if x not in rendezvous)
        assert pair.count("\n") == ring.count("\n") - 1
        for name, rules in (("ring", ring), ("pair", pair)):
            (tmp / f"{name}.nft").write_text(rules)
            sh(lan["head"], f"nft -f {tmp / f'{name}.nft'}")
            for port in ports:
                assert reaches("worker", port) == (name == "ring"), (name, port)
                assert not reaches("stranger", port), (name, port)
    finally:
        listener.kill()
        listener.wait()

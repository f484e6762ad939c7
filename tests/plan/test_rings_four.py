"""A ring of four in fabric_layout "ports" through the real CLI against strict @fake hosts cabled
as the rule says (tests/plan/rings/ringfakes.py): every rank gets its routes to the cable it is
not on, forwarding and rp_filter on its fabric netdevs, the unit that lets docker's forward chain
pass the relay, and a firewall accepting every other rank's addresses (the relayed ones too).
The deploy refuses the default (vLLM) stack on a ring (sparkrig/config/rules.py not_applied: stock
NCCL cannot run a ring of four): these tests lift that refusal to plan the fabric alone; the ring's
engine, stack tensorfold-ring, is tests/plan/test_rings_engine.py."""

from __future__ import annotations

import pytest

import sparkrig.config.inventory
from sparkrig.fabric import FORWARDING_FILE, RELAY_UNIT_FILE
from sparkrig.firewall import ruleset_path
from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.rings import ringfakes

INVENTORY = "tests/plan/rings/ring_four_state.py"
NAMES = ["spark-a", "spark-b", "spark-c", "spark-d"]


@pytest.fixture
def applied(monkeypatch) -> Run:
    monkeypatch.setattr(sparkrig.config.inventory, "not_applied", lambda settings: None)
    return run(["-y", INVENTORY, "deploy.py"], monkeypatch)


def test_every_rank_of_a_ring_of_four_relays_and_accepts_the_ranks_across(applied):
    r = applied
    assert r.exit_code == 0, r.output
    settings = fakehosts.settings_of(INVENTORY)
    for rank, short in enumerate(NAMES):
        name = f"@fake/{short}"
        s = settings[name]
        files, cmds = r.uploads[name], r.commands[name]
        # a route to each of the two cables this rank is not on, per function
        netplan = files[s.knobs.fabric_netplan_file].decode()
        assert netplan.count("via: ") == 4 and netplan.count("mtu: 9000") == 4, netplan
        # forwarding on every fabric netdev, applied; never ip_forward
        sysctl = files[FORWARDING_FILE].decode()
        settings_lines = [x for x in sysctl.splitlines() if x and not x.startswith("#")]
        assert sum(x.endswith(".forwarding = 1") for x in settings_lines) == 4
        assert not any("ip_forward" in x or ".all." in x for x in settings_lines)
        assert f"sysctl -p {FORWARDING_FILE}" in cmds
        # docker's forward chain passes the relay, again after every docker start
        unit = files[RELAY_UNIT_FILE].decode()
        assert unit.count("ExecStart=") == 4 and "PartOf=docker.service" in unit
        assert "systemctl enable sparkrig-relay.service" in cmds
        assert "systemctl start sparkrig-relay.service" in cmds
        # the firewall accepts every address of every other rank (relayed packets keep theirs)
        rules = files[ruleset_path(s)].decode()
        others = sorted(
            (ip for other in range(4) if other != rank
             for _, _, ip, _ in ringfakes.plan(4, other)),
            key=lambda ip: tuple(int(x) for x in ip.split(".")),
        )  # fmt: skip
        assert f"elements = {{ {', '.join(others)} }}" in rules


def test_a_pair_in_the_ports_layout_gets_no_relay(monkeypatch):
    r = run(["-y", "tests/plan/rings/pair_ports.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    for name, cmds in r.commands.items():
        assert RELAY_UNIT_FILE not in r.uploads[name] and FORWARDING_FILE not in r.uploads[name]
        assert [c for c in cmds if c.startswith("systemctl") and "sparkrig-relay" in c] == []

"""Every systemd unit sparkrig writes, rendered from the code (not from tests/golden), rated by
``systemd-analyze security --offline=true``: a unit whose exposure rises above its ceiling (a
sandbox line dropped or loosened, a capability added) fails here. The ceilings are the figures of
docs/hardening.md ("Exposure"); lower one when a unit is hardened further, never raise one
without saying why there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkrig import firewall
from sparkrig.config.inventory import build
from sparkrig.config.model import Settings
from sparkrig.fabric import relay_unit_text
from sparkrig.helperunits import (
    agent_unit_context,
    pair_unit_context,
    supervisor_unit_context,
    watchdog_unit_context,
)
from sparkrig.render import render
from sparkrig.serving import rank_unit_context, weights_id
from tests.unit.conftest import cluster
from tests.unit.test_rings import ring_settings

# systemd-analyze's figure per unit (0 safest, 10 least), measured with systemd 252; another
# systemd weighs its checks differently: measure there and say so in docs/hardening.md
CEILINGS = {
    "sparkrig-head.service": 4.2,
    "sparkrig-worker.service": 4.2,
    "sparkrig-pair.service": 2.1,
    "sparkrig-agent.service": 2.0,
    "sparkrig-supervisor.service": 2.0,
    "sparkrig-watchdog.service": 2.1,
    "sparkrig-firewall.service": 1.9,
    "sparkrig-relay.service": 1.8,
    "sparkrig-gpu-clock.service": 9.6,
}

ANALYZE = shutil.which("systemd-analyze")
OVERALL = re.compile(r"Overall exposure level for (\S+): (\d+\.\d+)")


def pair() -> tuple[Settings, Settings]:
    built = build(cluster(2, watchdog=True, gpu_clock_max_mhz=2400))
    return built["spark-0"], built["spark-1"]


def rank_unit(s: Settings) -> str:
    return render("sparkrig-rank.service.j2", **rank_unit_context(s, s.image_ref, weights_id(s)))


def relay_unit() -> str:
    text = relay_unit_text(ring_settings(4)["spark-0"])  # a ring of four relays on every rank
    assert text is not None
    return text


def gpu_clock_unit(s: Settings) -> str:
    mhz = s.knobs.gpu_clock_max_mhz
    return render("sparkrig-gpu-clock.service.j2", unit=s.unit_name, mhz=mhz)


def units() -> dict[str, Callable[[], str]]:
    """Each unit sparkrig writes on a rank, by file name, as the deploy renders it."""
    head, worker = pair()
    return {
        "sparkrig-head.service": lambda: rank_unit(head),
        "sparkrig-worker.service": lambda: rank_unit(worker),
        "sparkrig-pair.service": lambda: render(
            "sparkrig-pair.service.j2", **pair_unit_context(head)
        ),
        "sparkrig-agent.service": lambda: render(
            "sparkrig-agent.service.j2", **agent_unit_context(worker)
        ),
        "sparkrig-supervisor.service": lambda: render(
            "sparkrig-supervisor.service.j2", **supervisor_unit_context(head)
        ),
        "sparkrig-watchdog.service": lambda: render(
            "sparkrig-watchdog.service.j2", **watchdog_unit_context(head)
        ),
        "sparkrig-firewall.service": lambda: firewall.unit(head),
        "sparkrig-relay.service": relay_unit,
        "sparkrig-gpu-clock.service": lambda: gpu_clock_unit(head),
    }


def exposures(root: Path, texts: dict[str, str]) -> dict[str, float]:
    """systemd-analyze's overall exposure of each unit, the files written under ``root`` (so no
    unit or drop-in of this machine takes part)."""
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    for name, text in texts.items():
        (unit_dir / name).write_text(text)
    assert ANALYZE is not None
    r = subprocess.run(
        [ANALYZE, "security", "--offline=true", f"--root={root}", "--no-pager", *texts],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SYSTEMD_COLORS": "0", "LANG": "C"},
    )
    found = {m.group(1): float(m.group(2)) for m in OVERALL.finditer(r.stdout)}
    assert set(found) == set(texts), f"systemd-analyze rated {sorted(found)}:\n{r.stdout}{r.stderr}"
    return found


def test_every_unit_has_a_ceiling():
    assert set(units()) == set(CEILINGS)


@pytest.mark.skipif(ANALYZE is None, reason="no systemd-analyze here (Debian: apt install systemd)")
def test_no_unit_is_more_exposed_than_its_ceiling(tmp_path: Path):
    got = exposures(tmp_path, {name: make() for name, make in units().items()})
    over = {name: (got[name], ceiling) for name, ceiling in CEILINGS.items() if got[name] > ceiling}
    assert not over, (
        "exposure above the ceiling (got, ceiling), systemd-analyze security --offline=true: "
        f"{over}; docs/hardening.md says what each unit needs"
    )

"""What ``pyinfra inventory.py status.py`` reads from a rank, in one read-only remote command, and
how it is judged against what the deploy would install."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.command import QuoteString
from pyinfra.api.exceptions import FactProcessError
from sparkhost import lockfile, rankenv
from sparkhost.gid import GidEntry, gid_index, parse_gid_lines
from sparkhost.wedge import Probe, parse_probe, probe_file

from sparkrig.baseline import BaselineReport, describe, drift, parse_baseline
from sparkrig.baseline import script as baseline_script
from sparkrig.busbw import figure_text
from sparkrig.config.model import Settings
from sparkrig.fabricfacts import gid_table_command
from sparkrig.factlines import END, parse_key_values
from sparkrig.paths import revision_dir
from sparkrig.release import RECORD, Release, parse_record, record_path
from sparkrig.runtime import runtime_text
from sparkrig.serving import gpu_memory_utilization, memory_floor_gib
from sparkrig.topology import Iface

# Everything below only reads: systemctl show, docker inspect, cat/sed/grep of files, stat, awk.
# The GID table comes raw (gid_table_command) and is matched on the control side by the one rule
# the start gate and the deploy use (sparkhost.gid.select_gid).
GID_LINE_PREFIX = "/sys/class/infiniband/"
_SCRIPT = """\
systemctl show --property ActiveState --property SubState --property StateChangeTimestamp \
{unit}.service 2>/dev/null | sed 's/^/unit_/'
echo "image=$(docker inspect --format '{{{{.Config.Image}}}}' {container} 2>/dev/null)"
echo "gid_env=$({gid_env})"
if [ -e {gid_file} ]; then
  echo "gid_handed=$({gid_handed})"
  echo "gid_device_handed=$({gid_device_handed})"
  echo "gid_device_live=$({gid_device_live})"
  echo "gids_handed=$({gids_handed})"
  echo "devices_handed=$({devices_handed})"
  echo "devices_live=$({devices_live})"
fi
{gid_table}
echo "mtu=$(cat /sys/class/net/{iface}/mtu 2>/dev/null)"
echo "mtus=$(for d in {netdevs}; do printf '%s:%s,' "$d" \
"$(cat /sys/class/net/$d/mtu 2>/dev/null)"; done)"
echo "memfree_kb=$(awk '/^MemFree:/ {{print $2}}' /proc/meminfo)"
echo "memtotal_kb=$(awk '/^MemTotal:/ {{print $2}}' /proc/meminfo)"
for h in watchdog supervisor; do
  [ -f {run_dir}/$h-restarts.json ] && echo "budget_$h=$(tr -d '\n' < {run_dir}/$h-restarts.json)"
done
[ -f {probe_file} ] && echo "probe=$(tr -d '\n' < {probe_file})"
echo "gpu_clock_unit=$(systemctl show --property ActiveState --value sparkrig-gpu-clock.service \
2>/dev/null)"
echo "gpu_sm_mhz=$(nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits 2>/dev/null \
| head -n 1 | tr -cd '0-9')"
c=$(sed -n 's/^ *"commit": *"\\([0-9a-f]*\\)".*/\\1/p' {lock} 2>/dev/null)
echo "weights_commit=${{c%%[!0-9a-f]*}}"
echo "weights_verified=$(stat -c %Y {stamps} 2>/dev/null)"
( {baseline}
) | sed 's/^/bl./'
echo "release_record=$(tr -d '\\n' < {record} 2>/dev/null)"
echo '{end}'
"""
BASELINE_PREFIX = "bl."  # the host baseline's lines (sparkrig/baseline.py), inside this read


@dataclass(frozen=True)
class Budget:
    """A helper's restart budget as it wrote it (files/sparkhost/pair.py write_budget)."""

    restarts: tuple[float, ...] = ()  # wall-clock times of its ordered restarts
    max_restarts: int = 0
    window_s: float = 0

    def used(self, now: float) -> int:
        return sum(1 for t in self.restarts if now - t < self.window_s)

    def text(self, now: float) -> str:
        return f"{self.used(now)}/{self.max_restarts} in {self.window_s / 3600:g} h"


@dataclass(frozen=True)
class RankState:
    active: str = ""
    sub: str = ""
    since: str = ""
    image: str = ""
    gid_env: int | None = None
    gids: tuple[GidEntry, ...] = ()  # the live GID table, every device and port
    gid_handed: int | None = None
    mtu: int = 0
    memfree_kb: int = 0
    weights_commit: str = ""
    weights_verified: int = 0  # epoch seconds of the stamp DB's last write, 0 when none
    memtotal_kb: int = 0
    budgets: tuple[tuple[str, Budget], ...] = ()  # (helper, budget) of the head's helpers
    fabric: tuple[tuple[str, Any], ...] = ()  # the serving release's smoke-test figure
    runtime: tuple[tuple[str, Any], ...] = ()  # what its engine loaded (sparkrig/runtime.py)
    probe: Probe | None = None  # the watchdog's last probe (files/sparkhost/wedge.py)
    gpu_clock_unit: str = ""  # ActiveState of sparkrig-gpu-clock.service (knob gpu_clock_max_mhz)
    gpu_sm_mhz: int | None = None  # the SM clock now, when nvidia-smi reports one
    baseline: BaselineReport | None = None  # None: the read had no baseline lines
    recorded: tuple[tuple[str, str], ...] = ()  # the baseline the serving release passed on
    record_error: str = ""
    gid_device_handed: int | None = None  # the RDMA device's kernel index at the rank's start
    gid_device_live: int | None = None  # ... and now (None: gone)
    # fabric_layout "ports": per RDMA device, the GID index and kernel index its start gate
    # handed over and each device's kernel index now (a device gone is missing); per netdev, MTU
    gids_handed: tuple[tuple[str, int], ...] = ()
    devices_handed: tuple[tuple[str, int], ...] = ()
    devices_live: tuple[tuple[str, int], ...] = ()
    mtus: tuple[tuple[str, int], ...] = ()


def _int(raw: dict[str, str], key: str) -> int | None:
    text = raw.get(key, "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise FactProcessError(f"rank status: {key}={text!r} is not an integer") from None


def _per_device(raw: dict[str, str], key: str) -> tuple[tuple[str, int], ...]:
    """``<name>:<int>,...`` (rankenv.format_per_device); an entry without a number is left out."""
    return tuple(rankenv.parse_per_device(raw.get(key, "")).items())


def _budget(helper: str, text: str) -> Budget:
    import json

    try:
        raw = json.loads(text)
        return Budget(
            restarts=tuple(float(x) for x in raw["restarts"]),
            max_restarts=int(raw["max_restarts"]),
            window_s=float(raw["window_s"]),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise FactProcessError(f"rank status: {helper}'s restart budget: {err}") from None


def _serving_release(record: str) -> tuple[Release | None, str]:
    """The newest release in release.json's text (None when absent or unreadable) and why it
    is unreadable ('' when it is not): status shows its figure and judges its baseline."""
    try:
        releases = parse_record(record) if record else ()
    except ValueError as err:
        return None, f"{RECORD} is unreadable ({err})"
    return (releases[0] if releases else None), ""


def parse_rank_state(lines: list[str]) -> RankState:
    ours = [x[len(BASELINE_PREFIX) :] for x in lines if x.startswith(BASELINE_PREFIX)]
    lines = [x for x in lines if not x.startswith(BASELINE_PREFIX)]
    baseline = parse_baseline(ours) if ours else None
    table = [x for x in lines if x.startswith(GID_LINE_PREFIX)]
    raw = parse_key_values([x for x in lines if not x.startswith(GID_LINE_PREFIX)], "rank status")
    serving, record_error = _serving_release(raw.get("release_record", ""))
    try:
        gids = tuple(parse_gid_lines(table))
    except ValueError as err:
        raise FactProcessError(f"rank status: {err}") from None
    budgets = tuple(
        (key.removeprefix("budget_"), _budget(key.removeprefix("budget_"), value))
        for key, value in raw.items()
        if key.startswith("budget_")
    )
    try:
        probe = parse_probe(raw["probe"]) if raw.get("probe") else None
    except ValueError as err:
        raise FactProcessError(f"rank status: {err}") from None
    return RankState(
        probe=probe,
        gpu_clock_unit=raw.get("gpu_clock_unit", ""),
        gpu_sm_mhz=_int(raw, "gpu_sm_mhz"),
        active=raw.get("unit_ActiveState", ""),
        sub=raw.get("unit_SubState", ""),
        since=raw.get("unit_StateChangeTimestamp", ""),
        image=raw.get("image", ""),
        gid_env=_int(raw, "gid_env"),
        gids=gids,
        gid_handed=_int(raw, "gid_handed"),
        gid_device_handed=_int(raw, "gid_device_handed"),
        gid_device_live=_int(raw, "gid_device_live"),
        gids_handed=_per_device(raw, "gids_handed"),
        devices_handed=_per_device(raw, "devices_handed"),
        devices_live=_per_device(raw, "devices_live"),
        mtus=_per_device(raw, "mtus"),
        mtu=_int(raw, "mtu") or 0,
        memfree_kb=_int(raw, "memfree_kb") or 0,
        memtotal_kb=_int(raw, "memtotal_kb") or 0,
        budgets=budgets,
        weights_commit=raw.get("weights_commit", ""),
        weights_verified=_int(raw, "weights_verified") or 0,
        fabric=serving.fabric if serving is not None else (),
        runtime=serving.runtime if serving is not None else (),
        baseline=baseline,
        recorded=serving.baseline if serving is not None else (),
        record_error=record_error,
    )


class RankStatus(FactBase[RankState]):
    """One read-only command: a rank's unit, image, GID indexes, MTU, MemFree and weights."""

    default = RankState

    def command(
        self,
        unit: str,
        container: str,
        env_file: str,
        gid_file: str,
        iface: str,
        lock: str,
        stamps: str,
        run_dir: str,
        record: str,
        roce_device: str = "",
        netdevs: tuple[str, ...] = (),
    ) -> StringCommand:
        q = shlex.quote
        script = _SCRIPT.format(
            end=END,
            unit=q(unit),
            container=q(container),
            gid_file=q(gid_file),
            gid_env=rankenv.value_command(rankenv.GID_INDEX, env_file),
            gid_handed=rankenv.value_command(rankenv.HANDED, gid_file),
            gid_device_handed=rankenv.value_command(rankenv.HANDED_DEVICE_INDEX, gid_file),
            gid_device_live=rankenv.live_device_index_command(gid_file),
            gids_handed=rankenv.value_command(rankenv.HANDED_PER_DEVICE, gid_file),
            devices_handed=rankenv.value_command(rankenv.HANDED_DEVICE_INDEXES, gid_file),
            devices_live=rankenv.live_device_indexes_command(gid_file),
            gid_table=gid_table_command(),
            iface=q(iface),
            netdevs=" ".join(q(d) for d in netdevs or (iface,)),
            lock=q(lock),
            stamps=q(stamps),
            run_dir=q(run_dir),
            record=q(record),
            probe_file=q(probe_file(run_dir)),
            baseline=baseline_script(iface, roce_device or None),
        )
        return StringCommand("sh", "-c", QuoteString(script))

    def process(self, output: list[str]) -> RankState:
        return parse_rank_state(output)


def fact_args(s: Settings, env_file: str, gid_file: str, run_dir: str) -> dict[str, Any]:
    k = s.knobs
    return {
        "unit": s.unit_name,
        "container": s.container_name,
        "env_file": env_file,
        "gid_file": gid_file,
        "iface": s.me.fabric_interface,
        "lock": lockfile.installed_path(k.config_dir, "model"),
        "stamps": revision_dir(k.weights_dir, "model", s.model.revision) + ".stamps.json",
        "run_dir": run_dir,
        "record": record_path(k.config_dir),
        "roce_device": s.me.roce_device or "",
        "netdevs": s.fabric_rank.netdevs if s.fabric_rank is not None else (),
    }


def memfree_floor_kb(s: Settings, memtotal_kb: int) -> int:
    """The MemFree the start gate requires of this rank, in kB: sparkrig-prep's own
    memory_floor, fed the flags the rank unit gives it (units.memory_gate_args)."""
    from sparkhost import prep

    util = gpu_memory_utilization(s)
    floor = prep.memory_floor(
        memory_floor_gib(s), float(util), s.knobs.memfree_margin_gib, total=memtotal_kb * 1024
    )
    return int(floor) // 1024


def live_gid_index(s: Settings, st: RankState) -> int | None:
    """The index of this rank's RoCE v2 GID in the live table, by the start gate's own rule
    (sparkhost.gid.select_gid); None when the table has no such entry."""
    return gid_index(
        list(st.gids), s.me.ip, s.me.fabric_interface, s.me.roce_device, s.knobs.roce_port
    )


def single_problems(s: Settings, st: RankState) -> list[str]:
    """The one fabric netdev's GID (env file, hand-over, live table), device and MTU."""
    out = []
    live = live_gid_index(s, st)
    if st.gid_env is None or st.gid_env != live:
        out.append(f"GID index: env file {st.gid_env}, live table {live}")
    if st.gid_handed is not None and st.gid_handed != live:
        out.append(f"GID index: start gate handed over {st.gid_handed}, live table {live}")
    if rankenv.device_made_again(st.gid_device_handed, st.gid_device_live):
        out.append(
            f"RDMA device made again under the rank (kernel index {st.gid_device_handed} at its "
            f"start, {st.gid_device_live if st.gid_device_live is not None else 'gone'} now)"
        )
    if st.mtu != s.knobs.fabric_mtu:
        out.append(f"MTU {st.mtu} on {s.me.fabric_interface}, want {s.knobs.fabric_mtu}")
    return out


def function_readings(
    s: Settings, st: RankState
) -> list[tuple[Iface, int | None, int | None, int | None]]:
    """Each fabric function of the plan with its GID index in the live table, the one its start
    gate handed over and its netdev's MTU (None: not read)."""
    part, k = s.fabric_rank, s.knobs
    assert part is not None
    handed, mtus = dict(st.gids_handed), dict(st.mtus)
    return [
        (i, gid_index(list(st.gids), str(i.address.ip), i.netdev, i.rdma, k.roce_port),
         handed.get(i.rdma), mtus.get(i.netdev))
        for i in part.ifaces
    ]  # fmt: skip


def fabric_problems(s: Settings, st: RankState) -> list[str]:
    """fabric_layout "ports": every function's GID by value in the live table against what the
    start gate handed over, its device made again or gone, its netdev's MTU (the env file pins
    no GID index: NCCL picks each one, docs/rings.md)."""
    k = s.knobs
    out = []
    for i, live, was, mtu in function_readings(s, st):
        if live is None:
            out.append(f"{i.rdma}: no RoCE v2 GID for ::ffff:{i.address.ip} on {i.netdev}")
        if was is not None and live is not None and was != live:
            out.append(f"{i.rdma}: GID index: start gate handed over {was}, live table {live}")
        if mtu != k.fabric_mtu:
            out.append(f"MTU {mtu if mtu is not None else '?'} on {i.netdev}, want {k.fabric_mtu}")
    now = dict(st.devices_live)
    for dev in rankenv.device_indexes_made_again(dict(st.devices_handed), now):
        out.append(
            f"{dev}: RDMA device made again under the rank (kernel index "
            f"{dict(st.devices_handed)[dev]} at its start, {now.get(dev, 'gone')} now)"
        )
    return out


def problems(s: Settings, st: RankState, want_image: str) -> list[str]:
    """What is off on this rank, one phrase each; empty when it serves as deployed."""
    k = s.knobs
    out: list[str] = []
    if st.active != "active" or st.sub != "running":
        out.append(f"{s.unit_name} is {st.active or 'unknown'}/{st.sub or 'unknown'}")
    if st.image != want_image:
        out.append(f"runs image {st.image or 'none'}, the deploy would run {want_image}")
    out += fabric_problems(s, st) if s.fabric_rank is not None else single_problems(s, st)
    if k.gpu_clock_max_mhz is not None and st.gpu_clock_unit != "active":
        out.append(
            f"GPU clock lock sparkrig-gpu-clock is {st.gpu_clock_unit or 'absent'}: the clock is "
            f"not capped at {k.gpu_clock_max_mhz} MHz (re-run the deploy)"
        )
    if st.weights_commit != s.model.revision:
        out.append(f"weights {st.weights_commit or 'absent'}, want {s.model.revision}")
    # A serving rank holds its memory; a rank that is down must find the start gate's floor free,
    # or its next start is refused (docs/sources.md, "Memory gate").
    # (a stack whose gate measures other than MemFree is judged by its start gate alone)
    memfree_gate = s.stack.memory.measure == "memfree"
    floor = memfree_floor_kb(s, st.memtotal_kb) if st.memtotal_kb and memfree_gate else 0
    if st.active != "active" and st.memfree_kb < floor:
        out.append(
            f"MemFree {st.memfree_kb / 1024**2:.1f} GiB is below the start gate's floor "
            f"{floor / 1024**2:.1f} GiB: the rank would refuse to start (sparkrig-prep lists "
            "what holds the memory)"
        )
    return out


def baseline_line(st: RankState) -> str:
    """The rank's baseline, and what moved since the gates passed on the recorded one."""
    if st.baseline is None:
        return "baseline: not read"
    moved = drift(dict(st.recorded), st.baseline)
    since = (
        f"moved since the gates passed: {'; '.join(moved)}"
        if moved
        else ("as recorded when the gates passed" if st.recorded else "none recorded yet")
    )
    return f"baseline: {describe(st.baseline)} | {since}"


def baseline_problems(st: RankState) -> list[str]:
    """A baseline that moved since the gates passed on it: the pair was not proven on it."""
    out = [st.record_error] if st.record_error else []
    if st.baseline is not None and st.recorded:
        moved = drift(dict(st.recorded), st.baseline)
        if moved:
            out.append(
                f"baseline moved since the gates passed ({'; '.join(moved)}): run the deploy, "
                "whose gates prove and record it"
            )
    return out


def budget_problems(st: RankState, now: float) -> list[str]:
    """A helper whose restart budget is spent leaves the pair down for a human."""
    return [
        f"the {helper} spent its restart budget ({budget.text(now)}): it restarts nothing more; "
        "read its journal, then run sudo sparkrig-restart-pair on the head"
        for helper, budget in st.budgets
        if budget.max_restarts and budget.used(now) >= budget.max_restarts
    ]


def budget_line(st: RankState, watchdog_on: bool, now: float) -> str:
    """The head's helpers' restarts used in their windows, for the pair's line."""
    held = dict(st.budgets)
    parts = []
    for helper in ("supervisor", "watchdog"):
        if helper == "watchdog" and not watchdog_on:
            parts.append("watchdog off")
        elif helper in held:
            parts.append(f"{helper} restarts {held[helper].text(now)}")
        else:
            parts.append(f"{helper} restarts unknown (not running)")
    return "; ".join(parts)


def probe_line(st: RankState, watchdog_on: bool, now: float) -> str:
    """The watchdog's last probe, as the pair helpers' line ends."""
    if not watchdog_on:
        return ""
    return f"; last probe: {st.probe.text(now) if st.probe else 'none yet'}"


def gpu_clock_text(s: Settings, st: RankState) -> str:
    """The GPU clock cap as the rank's line shows it."""
    mhz = s.knobs.gpu_clock_max_mhz
    text = "unlocked" if mhz is None else f"<= {mhz} MHz ({st.gpu_clock_unit or 'absent'})"
    return text + (f", sm {st.gpu_sm_mhz} MHz" if st.gpu_sm_mhz is not None else "")


def single_text(st: RankState, live: int | None) -> str:
    """The one fabric netdev's GID index (env file, live, handed over) and MTU."""
    handed = f" handed={st.gid_handed}" if st.gid_handed is not None else ""
    return f"gid env={st.gid_env} live={live}{handed} | mtu {st.mtu}"


def functions_text(s: Settings, st: RankState) -> str:
    """Each fabric function's GID index live (and as its start gate handed it over) and MTU,
    in a plan layout: ``rocep1s0f1 gid 3/3 mtu 9000, roceP2p1s0f1 gid 5/5 mtu 9000``."""
    out = []
    for i, live, was, mtu in function_readings(s, st):
        seen = f"{'-' if live is None else live}/{'-' if was is None else was}"
        out.append(f"{i.rdma} gid {seen} mtu {'?' if mtu is None else mtu}")
    return "fabric " + ", ".join(out)


def line(s: Settings, st: RankState, verified: str) -> str:
    """The rank's one line of the status screen."""
    fabric = (
        single_text(st, live_gid_index(s, st)) if s.fabric_rank is None else functions_text(s, st)
    )
    return (
        f"rank{s.me.rank} {s.unit_name} {st.active}/{st.sub} since {st.since or '-'} | "
        f"image {st.image.rsplit(':', 1)[-1] or '-'} | {fabric} | "
        f"weights {st.weights_commit[:12] or '-'} verified {verified} | "
        f"{figure_text(dict(st.fabric))} | {runtime_text(dict(st.runtime))} | "
        f"gpu clock {gpu_clock_text(s, st)} | "
        f"MemFree {st.memfree_kb // 1024} MiB"
        + (
            f" (start floor {memfree_floor_kb(s, st.memtotal_kb) // 1024} MiB)"
            if st.memtotal_kb
            else ""
        )
    )


def without_confirmation() -> None:
    """No "Press enter to execute..." for this run (status.py: it only reads). pyinfra 3.10 asks
    whenever -y is not given (pyinfra_cli/cli.py ``_do_confirm``, looked up at call time), so
    that prompt is answered yes for this process; under the API (no CLI) it does nothing."""
    import sys

    cli = sys.modules.get("pyinfra_cli.cli")
    if cli is not None and hasattr(cli, "_do_confirm"):
        setattr(cli, "_do_confirm", lambda msg: True)  # noqa: B010 (a module found at run time)

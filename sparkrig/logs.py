"""``python3 -m sparkrig logs [--inventory inventory.py] [--pair NAME] [--rank N] [-n LINES]
[--follow]``: each rank's journals, read over SSH as the inventory says: its engine's unit (the
container's output: the engine's boot stages, its errors), its stop-together watch and its helpers
(the head's supervisor and watchdog, a worker's agent). Read-only; every line prefixed with its
rank, and in an inventory of several pairs with its pair (``--pair`` reads one pair alone).

A rank's journal is read with ``sudo -n`` where sudo needs no password, else as the SSH user
(DGX OS puts the first user in ``adm``, which reads the system journal; one outside it and
``systemd-journal`` sees "-- No entries --")."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkrig.config.inventory import build, view_of


@dataclass(frozen=True)
class RankLogs:
    """Where one rank's journals are and which units they are."""

    name: str
    rank: int
    ssh: tuple[str, ...]  # argv up to the remote command
    units: tuple[str, ...]
    pair: str = ""  # its pair's name; "": the inventory is one cluster

    @property
    def prefix(self) -> str:
        """What each of its lines begins with: ``[rank1 spark-b]``, ``[pair_a rank1 spark-b]``."""
        return f"[{self.pair + ' ' if self.pair else ''}rank{self.rank} {self.name}]"


def units_of(unit_name: str, is_head: bool) -> tuple[str, ...]:
    helpers = ("sparkrig-supervisor", "sparkrig-watchdog") if is_head else ("sparkrig-agent",)
    return (unit_name, "sparkrig-pair", *helpers)


def ssh_argv(data: dict[str, Any], name: str) -> tuple[str, ...]:
    """``ssh`` to a host as the inventory's data says (pyinfra's ``ssh_*`` keys)."""
    argv = ["ssh", "-o", "BatchMode=yes"]
    if data.get("ssh_port"):
        argv += ["-p", str(data["ssh_port"])]
    if data.get("ssh_key"):
        argv += ["-i", str(data["ssh_key"])]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
        argv += ["-o", "StrictHostKeyChecking=yes"]
    host = str(data.get("ssh_hostname") or name)
    user = data.get("ssh_user")
    return (*argv, f"{user}@{host}" if user else host)


def journal_command(units: Sequence[str], lines: int, follow: bool) -> str:
    """The remote shell command: the units' journal, merged in time order."""
    args = ["journalctl", "--no-pager", "-o", "short-iso", "-n", str(lines)]
    for unit in units:
        args += ["-u", unit]
    if follow:
        args.append("-f")
    plain = shlex.join(args)
    # sudo first: a user outside adm/systemd-journal reads "-- No entries --" and succeeds
    return f"if sudo -n true 2>/dev/null; then exec sudo -n {plain}; else exec {plain}; fi"


def command_of(r: RankLogs, lines: int, follow: bool) -> list[str]:
    return [*r.ssh, journal_command(r.units, lines, follow)]


def ranks_of(inventory: str, only: int | None, pair: str | None = None) -> list[RankLogs]:
    """Every rank of the inventory (or rank ``only``, of each pair or of ``pair`` alone),
    validated as the deploy validates it, pair by pair in the inventory's order."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):  # pyinfra's CLI loads inventories inside a state
        inv = make_inventory(inventory, cwd=".")
    settings = build(view_of(inv))
    pairs = list(dict.fromkeys(s.pair for s in settings.values()))
    if pair is not None and pair not in pairs:
        named = ", ".join(p for p in pairs if p) or "none: it is one cluster"
        raise SystemExit(f"logs: no pair {pair!r} in {inventory} (its pairs: {named})")
    out = []
    for host in inv:
        s = settings[host.name]
        if (only is None or s.me.rank == only) and pair in (None, s.pair):
            units = units_of(s.unit_name, s.me.is_head)
            ssh = ssh_argv(dict(host.data.dict()), host.name)
            out.append(RankLogs(host.name, s.me.rank, ssh, units, s.pair))
    if not out:
        most = max(len(s.ranks) for s in settings.values()) - 1
        raise SystemExit(f"logs: no rank {only} in {inventory} (ranks 0..{most})")
    return sorted(out, key=lambda r: (pairs.index(r.pair), r.rank))


def stream(r: RankLogs, lines: int, follow: bool, lock: threading.Lock) -> int:
    proc = subprocess.Popen(command_of(r, lines, follow), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            print(f"{r.prefix} {line.rstrip()}", flush=True)
    return proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m sparkrig logs", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--inventory", default="inventory.py")
    ap.add_argument("--pair", help="one pair of the inventory (host data pair); default every one")
    ap.add_argument("--rank", type=int, help="one rank (0: the head); default every rank")
    ap.add_argument("-n", "--lines", type=int, default=100, help="lines per rank (default 100)")
    ap.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    args = ap.parse_args(argv)
    ranks = ranks_of(args.inventory, args.rank, args.pair)
    lock = threading.Lock()
    if not args.follow:
        return max(stream(r, args.lines, False, lock) for r in ranks)
    threads = [threading.Thread(target=stream, args=(r, args.lines, True, lock), daemon=True)
               for r in ranks]  # fmt: skip
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

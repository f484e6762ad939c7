"""``python3 -m sparkrig init [USER@]HEAD[:PORT] [USER@]WORKER[:PORT] ... [--out inventory.py]``:
an inventory from the boxes themselves. Each box's SSH host key is pinned into
``.sparkrig/known_hosts`` (its fingerprint printed, to compare at the box's console; a key that
differs from one pinned before is refused), then each box is probed over SSH, read-only
(sparkrig/probe.py): the cabled QSFP function and its second one, the uplinks, sudo, NTP, the
kernel and KHO, the netplan files naming the fabric NIC, free disk. The inventory is written
(an existing file is kept beside it as ``<out>.bak``), checked as ``sparkrig check`` checks it,
and the head asked whether it reaches the Hub, the image registry and its package archive.
Then every step the operator must still take, each with its command.

Exit 0: written, and nothing stands in the deploy's way; 1: something does (listed), or the
boxes could not be probed (nothing written); 2: bad arguments."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkhost.pairmac import WINDOW_S

from sparkrig import baseline, probe
from sparkrig.check import host_key_problems, overrides
from sparkrig.config.inventory import for_inventory
from sparkrig.config.model import Settings
from sparkrig.logs import ssh_argv
from sparkrig.node import NodeReport
from sparkrig.preflight import disk_problem
from sparkrig.probe import Probe
from sparkrig.reach import Reach, hub_url, registry_url
from sparkrig.weights import artifacts

SSH_TIMEOUT_S = 20
_USER = re.compile(r"^[a-z_][a-z0-9_.-]*$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Target:
    """One box as the operator named it: ``[user@]host[:port]``."""

    host: str
    user: str = ""
    port: int = 22

    @classmethod
    def parse(cls, spec: str) -> Target:
        user, at, rest = spec.rpartition("@")
        host, colon, port = rest.partition(":")
        if (at and not _USER.match(user)) or not _HOST.match(host):
            raise ValueError(f"{spec!r} is not [USER@]HOST[:PORT] (a hostname or IPv4 address)")
        if colon and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{spec!r}: the port must be a number from 1 to 65535")
        return cls(host, user, int(port) if colon else 22)

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


class InitError(Exception):
    """A box that cannot be probed, or a pinned key that differs: nothing is written."""


def ssh_base(t: Target, known_hosts: str, key: str | None) -> list[str]:
    """``ssh`` to the box as an inventory naming it would (``logs.ssh_argv``: batch mode, the
    pinned host keys, strictly), with a connect timeout: a box that is off fails init fast."""
    data = {"ssh_hostname": t.host, "ssh_port": t.port, "ssh_user": t.user, "ssh_key": key,
            "ssh_known_hosts_file": known_hosts}  # fmt: skip
    argv = list(ssh_argv(data, t.host))
    return [argv[0], "-o", f"ConnectTimeout={SSH_TIMEOUT_S}", *argv[1:]]


def scanned_keys(t: Target) -> list[str]:
    """The box's ed25519 host key lines, as ``ssh-keyscan`` reads them off the wire."""
    got = subprocess.run(
        ["ssh-keyscan", "-T", str(SSH_TIMEOUT_S), "-t", "ed25519", "-p", str(t.port), t.host],
        capture_output=True, text=True,
    )  # fmt: skip
    lines = [line for line in got.stdout.splitlines() if line and not line.startswith("#")]
    if not lines:
        raise InitError(
            f"{t.host}: no SSH host key read on port {t.port} ({got.stderr.strip() or 'no answer'}"
            f"): is the box up and its sshd listening? `ssh -p {t.port} {t.host}` tells"
        )
    return lines


def fingerprint(line: str) -> str:
    got = subprocess.run(["ssh-keygen", "-lf", "-"], input=line + "\n", capture_output=True,
                         text=True)  # fmt: skip
    return got.stdout.split()[1] if got.returncode == 0 and got.stdout.split() else "?"


def pinned_keys(known_hosts: Path, t: Target) -> list[str]:
    if not known_hosts.is_file():
        return []
    got = subprocess.run(["ssh-keygen", "-F", t.known_hosts_name, "-f", str(known_hosts)],
                         capture_output=True, text=True)  # fmt: skip
    return [line for line in got.stdout.splitlines() if line and not line.startswith("#")]


def pin(t: Target, known_hosts: Path) -> str:
    """Pin the box's host key (a key already pinned must be the one it shows); its
    fingerprint, or what changed."""
    scanned = scanned_keys(t)
    fp = fingerprint(scanned[0])
    pinned = pinned_keys(known_hosts, t)
    if pinned:
        if {fingerprint(p) for p in pinned} != {fp}:
            raise InitError(
                f"{t.host}: its host key ({fp}) is not the one pinned in {known_hosts}: the box "
                "was reinstalled, or this is not the box. If you trust it (compare `ssh-keygen "
                "-lf /etc/ssh/ssh_host_ed25519_key.pub` at its console), remove the old key: "
                f"`ssh-keygen -R '{t.known_hosts_name}' -f {known_hosts}`, then run init again"
            )
        return f"{t.known_hosts_name}: host key {fp}, already pinned in {known_hosts}"
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    with known_hosts.open("a") as f:
        f.write("\n".join(scanned) + "\n")
    return (
        f"{t.known_hosts_name}: host key {fp} pinned in {known_hosts}: compare it with "
        "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` at the box's console"
    )


def probe_box(t: Target, known_hosts: str, key: str | None) -> Probe:
    got = subprocess.run([*ssh_base(t, known_hosts, key), "sh", "-s"], input=probe.script(),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    if got.returncode == 255:
        why = got.stderr.strip().splitlines()[-1:] or ["no answer"]
        login = f"{t.user}@{t.host}" if t.user else t.host
        raise InitError(
            f"{t.host}: ssh failed ({why[0]}): init logs in by key (no password prompt); "
            f"`ssh-copy-id -p {t.port} {login}` installs yours"
        )
    try:
        return probe.parse(got.stdout.splitlines())
    except ValueError as err:
        raise InitError(f"{t.host}: {err}") from None


# --- the inventory ---------------------------------------------------------------------------


def host_entries(
    targets: list[Target], probes: list[Probe], key: str | None, known_hosts: str
) -> list[tuple[str, dict[str, Any]]]:
    """(name, host data) of every box in rank order; the names are the boxes' own hostnames."""
    fabric, _ = probe.fabric_choice(probes)
    addresses = probe.fabric_addresses(probes, fabric) if fabric else []
    out: list[tuple[str, dict[str, Any]]] = []
    for i, (t, p) in enumerate(zip(targets, probes, strict=True)):
        name = p.hostname or t.host
        if name in (n for n, _ in out):
            name = f"{name}-{i}"
        data: dict[str, Any] = {"ssh_hostname": t.host}
        if t.port != 22:
            data["ssh_port"] = t.port
        if t.user:
            data["ssh_user"] = t.user
        if key:
            data["ssh_key"] = key
        data["ssh_known_hosts_file"] = known_hosts
        data["ssh_strict_host_key_checking"] = "yes"
        if fabric:
            data["fabric_interface"] = fabric
            data["fabric_address"] = addresses[i]
            data["roce_device"] = next(r.device for r in p.rdma if r.netdev == fabric)
        lanes = probe.uplinks(p, fabric)
        if len(lanes) > 1:
            data["uplink_interfaces"] = lanes
        out.append((name, data))
    return out


def _host_block(name: str, data: dict[str, Any]) -> str:
    rows = "".join(f"            {k!r}: {v!r},\n" for k, v in data.items())
    return (
        f"    (\n        {name!r},\n        {{\n{rows}            **KNOBS,\n        }},\n    ),\n"
    )


def inventory_text(
    entries: list[tuple[str, dict[str, Any]]], knobs: dict[str, Any], cmdline: str
) -> str:
    """The inventory's source: the boxes' keys, then the ``--set`` knobs every host carries."""
    knob_rows = "".join(f"    {k!r}: {v!r},\n" for k, v in knobs.items())
    return (
        f'"""Written by `{cmdline}`, from what the boxes said.\n\n'
        "One host in `head` (rank 0), the others in `worker`. Every other knob is in\n"
        'group_data/all.py; the per-host keys: docs/operating.md "Inventory". init run again\n'
        'rewrites it and keeps the file before as <name>.bak.\n"""\n\n'
        "# init's --set knobs: host data, so they beat group_data (--data still beats them)\n"
        f"KNOBS = {{\n{knob_rows}}}\n\n"
        f"head = [\n{_host_block(*entries[0])}]\n\n"
        f"worker = [\n{''.join(_host_block(*e) for e in entries[1:])}]\n"
    )


def write_inventory(path: Path, text: str) -> str:
    """Write ``path``; an existing file different from ``text`` is kept as ``<path>.bak``."""
    said = f"wrote {path}"
    if path.exists() and path.read_text() != text:
        backup = path.with_name(path.name + ".bak")
        path.replace(backup)
        said += f" (the one before is {backup})"
    path.write_text(text)
    return said


# --- what is left to do ----------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """Something the operator should do first; ``blocks``: the deploy refuses until it is."""

    text: str
    blocks: bool = True


def box_todo(t: Target, p: Probe, fabric: str | None, ours: str | None) -> list[Step]:
    """Each step this box needs before a deploy, with its command (``ours``: sparkrig's own
    netplan file; None when the inventory was refused, and the other claims go unjudged)."""
    login = f"ssh -t -p {t.port} {t.user + '@' if t.user else ''}{t.host}"
    out = []
    if p.sudo == "none":
        out.append(Step(f"{p.user} has no sudo: log in as the DGX OS user made at first boot"))
    elif p.sudo == "password":
        sudoers = f"echo '{p.user} ALL=(ALL) NOPASSWD: ALL' | sudo tee /etc/sudoers.d/90-sparkrig"
        out.append(Step(
            f"sudo asks {p.user} for a password: the deploy asks `sudo password:` once per host "
            f"(--same-sudo-password: once), or allow it without: `{login} {shlex.quote(sudoers)}`",
            blocks=False))  # fmt: skip
    if not p.ntp:
        out.append(Step(
            "no time service is on (the helpers' signed calls need the ranks' clocks within "
            f"{WINDOW_S / 2:g} s; preflight refuses a larger skew): "
            f"`{login} sudo timedatectl set-ntp true`", blocks=False))  # fmt: skip
    if not p.docker:
        out.append(Step(f"no docker: DGX OS ships it; `{login} sudo apt-get install docker.io`"))
    if p.base.kho_active:
        grub = 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX kho=off"'
        fix = (f"printf '%s\\n' {shlex.quote(grub)} | sudo tee {baseline.GRUB_DROPIN} && "
               "sudo update-grub && sudo reboot")  # fmt: skip
        out.append(Step(
            f"kernel {p.base.kernel} boots with kexec handover on, which breaks NCCL's memory "
            f"registration (preflight refuses it): boot with kho=off: `{login} {shlex.quote(fix)}`"
        ))  # fmt: skip
    if fabric and ours:
        for path in (c for c in p.claims_of(fabric) if c != ours):
            out.append(Step(
                f"{path} configures {fabric} too (NVIDIA's playbook writes one): set "
                "`fabric_takeover = True` in group_data/all.py (the deploy moves it aside under "
                f"/var/lib/sparkrig/displaced), or `{login} sudo mv {shlex.quote(path)} ~/`"
            ))  # fmt: skip
        if p.netplan_unread:
            out.append(Step(
                f"{', '.join(p.netplan_unread)} could not be read without a sudo password: if "
                f"one names {fabric}, set `fabric_takeover = True` (preflight names it too)",
                blocks=False))  # fmt: skip
    return out


def head_reach(t: Target, known_hosts: str, key: str | None, urls: dict[str, str]) -> list[str]:
    """What the head cannot reach of ``urls`` (url -> what it needs from it)."""

    cmd = Reach().command(tuple(urls)).get_raw_value()
    got = subprocess.run([*ssh_base(t, known_hosts, key), cmd], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    said = {}
    for line in got.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        url, _, why = rest.partition(" ")
        said[url] = (verdict == "ok", why)
    out = []
    for url, what in urls.items():
        ok, why = said.get(url, (False, "no answer"))
        if not ok:
            out.append(f"the head does not reach {url} ({why}), where {what} comes from: check "
                       f"its DNS, route and proxy (`curl -I {url}` there)")  # fmt: skip
    return out


def checked(out: Path, targets: list[Target], probes: list[Probe], known_hosts: str,
            key: str | None) -> tuple[list[str], Settings | None]:  # fmt: skip
    """The written inventory as the deploy would refuse it offline, then the head's reach and
    every box's disk against what the stack downloads; and its settings (None when refused)."""
    from pyinfra.api import State
    from pyinfra.api.exceptions import DeployError
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):
        inventory = make_inventory(str(out), cwd=".")
        problems = host_key_problems(inventory)
        try:
            settings = for_inventory(inventory)
        except DeployError as err:
            return [*problems, str(err).replace("\n", "\n    ")], None
    s = next(iter(settings.values()))
    download = sum(a.total_bytes for a in artifacts(s))
    for p in probes:
        # the weights land under weights_dir; the probe measured its usual filesystem
        short = disk_problem(s, NodeReport(disk_free=p.disk_free), download)
        if short:
            problems.append(f"{p.hostname}: {short}")
    urls = {
        hub_url(s): f"the weights ({s.model.repo})",
        registry_url(s.image_ref): f"the base image ({s.image_ref.partition('@')[0]})",
    }
    for archive in probes[0].archives[:1] if not probes[0].nginx else ():
        urls[archive] = "nginx, the API front (apt)"
    return problems + head_reach(targets[0], known_hosts, key, urls), s


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m sparkrig init",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("boxes", nargs="+", metavar="[USER@]HOST[:PORT]",
                    help="the head first, then each worker")  # fmt: skip
    ap.add_argument("--key", help="the SSH private key (default: your agent and ~/.ssh)")
    ap.add_argument("--known-hosts", default=".sparkrig/known_hosts")
    ap.add_argument("--out", default="inventory.py")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a knob for every host, written into the inventory (as --data reads "
                    "it)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        targets = [Target.parse(b) for b in args.boxes]
    except ValueError as err:
        ap.error(str(err))
    if len(targets) < 2:
        ap.error("name two boxes or more: the head first, then each worker")

    knobs = overrides(args.set)
    known = Path(args.known_hosts)
    try:
        for t in targets:
            print(f"init: {pin(t, known)}")
        probes = [probe_box(t, str(known), args.key) for t in targets]
    except (InitError, subprocess.TimeoutExpired) as err:
        print(f"init: nothing written: {err}", file=sys.stderr)
        return 1
    fabric, why_none = probe.fabric_choice(probes)
    for t, p in zip(targets, probes, strict=True):
        second = probe.second_function(p, fabric) if fabric else None
        also = f" (its second function: {second.netdev})" if second else ""
        print(f"init: {p.hostname} ({t.host}): fabric {fabric or '?'}{also}, uplinks "
              f"{', '.join(probe.uplinks(p, fabric)) or 'none'}, kernel {p.base.kernel}, sudo "
              f"{p.sudo}, NTP {'on' if p.ntp else 'off'}, {p.disk_free / 1024**3:.0f} GiB free "
              f"under {probe.WEIGHTS_PARENT}")  # fmt: skip
    cmdline = shlex.join(["python3", "-m", "sparkrig", "init", *(argv or sys.argv[1:])])
    entries = host_entries(targets, probes, args.key, str(known))
    out = Path(args.out)
    print(f"init: {write_inventory(out, inventory_text(entries, knobs, cmdline))}")
    if why_none:
        refused = [f"{why_none}: cable the QSFP ports (`ibdev2netdev` shows them (Up)), or set "
                   f"fabric_interface and fabric_address in {out}"]  # fmt: skip
        s = None
    else:
        refused, s = checked(out, targets, probes, str(known), args.key)
    ours = s.knobs.fabric_netplan_file if s else None
    steps = [Step(f"{p.hostname}: {step.text}", step.blocks)
             for t, p in zip(targets, probes, strict=True)
             for step in box_todo(t, p, fabric, ours)] + [Step(r) for r in refused]  # fmt: skip
    for title, blocks in (("advised", False), ("before the deploy", True)):
        listed = [f"  - {step.text}" for step in steps if step.blocks == blocks]
        if listed:
            print(f"init: {title}:\n" + "\n".join(listed))
    if any(step.blocks for step in steps):
        return 1
    print(f"init: ready: `pyinfra {out} deploy.py --dry --diff` to review, then without --dry")
    return 0


if __name__ == "__main__":
    sys.exit(main())

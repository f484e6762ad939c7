"""Is the pair whole? Every check the campaign makes after a fault's run, as commands it prints
(``--list``) and runs. Each check returns the problems it found, one line each; none means whole.

1. both ranks serving, in order: every worker's rank unit active with its container running (not
   paused), the head's rank unit active and its current start gate logged "every peer is up";
2. a completion answers with the control machine's key (.sparkrig/api-key), from the head;
3. the fabric MTU, address and RoCE GID right on every rank (the env file's index, the one the
   start gate handed over and the container's NCCL_IB_GID_INDEX all equal the live table's; the
   RDMA device's kernel index handed over is the device's now: not one made again), and
   vm.swappiness live;
4. weights verified (the fetcher's quick verify against the rank's lockfile) and no .part left;
5. owned files as declared: ``pyinfra --dry --json lab/inventory.py deploy.py`` plans no
   unconditional change (``_if``-gated operations are always listed by --dry: item 3 checks the
   live drift they gate on);
6. no sparkrig unit restarted (InvocationID / ActiveEnterTimestampMonotonic changed) or stopped
   that the fault may not restart."""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from sparkhost import rankenv

from bench.chaos import pyinfra_output
from bench.chaos.catalogue import fill
from lab import REPO
from lab.guest import SPARKHOST, Guest, control_api_key, fabric_functions, gid_index_for

INVENTORY = "lab/inventory.py"
FABRIC_MTU = 9000  # the lab keeps the fabric_mtu default
SWAPPINESS = "0"  # ... and the swappiness default
LOCK = "/etc/sparkrig/model.lock.json"
DRY = ["pyinfra", "--dry", "--json", INVENTORY, "deploy.py"]

UNITS = (
    "for u in $(systemctl list-units --all --plain --no-legend --type=service 'sparkrig-*' "
    "| grep -o 'sparkrig-[^ ]*\\.service'); do systemctl show -p Id -p Transient "
    "-p ActiveState -p InvocationID -p ActiveEnterTimestampMonotonic $u | tr '\\n' ' '; echo; "
    "done"
)
ORDER = (
    "echo state=$(systemctl is-active {unit}); "
    "inv=$(systemctl show -p InvocationID --value {unit}); n=0; "
    '[ -n "$inv" ] && n=$(journalctl _SYSTEMD_INVOCATION_ID=$inv --no-pager -o cat '
    "| grep -c 'every peer is up'); [ \"${n:-0}\" = 0 ] && n=$(journalctl -u {unit} --no-pager "
    '-o cat --since "$(systemctl show -p InactiveExitTimestamp --value {unit})" '
    "| grep -c 'every peer is up'); echo peers=${n:-0}; "
    "echo container=$(docker inspect -f '{{.State.Running}} {{.State.Paused}}' {container} 2>&1)"
)
COMPLETION = (
    "printf 'Authorization: Bearer %s\\n' {key} "
    "| curl --cacert /etc/sparkrig/api-ca.crt -s -m 60 -H @- "
    "-H 'Content-Type: application/json' --data-binary {body} "
    "https://127.0.0.1:8000/v1/chat/completions"
)
FABRIC = (
    "echo mtu=$(cat /sys/class/net/{iface}/mtu); echo swappiness=$(sysctl -n vm.swappiness); "
    "echo address=$(ip -o -4 addr show dev {iface} | grep -c ' {address} '); "
    "echo env=$(sed -n 's/^NCCL_IB_GID_INDEX=//p' /etc/sparkrig/rank.env 2>/dev/null); "
    "echo handed=$(sed -n 's/^SPARKRIG_GID_INDEX=//p' /run/sparkrig/gid.env 2>/dev/null "
    "| tail -n 1); echo container=$(docker exec {container} printenv NCCL_IB_GID_INDEX 2>&1); "
    "d=$(sed -n 's/^SPARKRIG_ROCE_DEVICE=//p' /run/sparkrig/gid.env 2>/dev/null | tail -n 1); "
    "echo device_handed=$(sed -n 's/^SPARKRIG_ROCE_DEVICE_INDEX=//p' /run/sparkrig/gid.env "
    '2>/dev/null | tail -n 1); echo device_live=$(rdma dev show "$d" 2>/dev/null '
    "| sed -n 's/^\\([0-9][0-9]*\\): .*/\\1/p')"
)
# a pair on both functions (the default lab): each function's MTU and address, every device's
# GID index and kernel index as its start gate handed them over (no index pinned in the env)
FUNCTION = (
    "echo mtu_{i}=$(cat /sys/class/net/{iface}/mtu); "
    "echo address_{i}=$(ip -o -4 addr show dev {iface} | grep -c ' {ip}/'); "
    "echo device_live_{i}=$(rdma dev show {rdma} 2>/dev/null "
    "| sed -n 's/^\\([0-9][0-9]*\\): .*/\\1/p'); "
)
FUNCTIONS = (
    "echo swappiness=$(sysctl -n vm.swappiness); "
    "echo env=$(sed -n 's/^NCCL_IB_GID_INDEX=//p' /etc/sparkrig/rank.env 2>/dev/null); "
    "echo handed=$(sed -n 's/^SPARKRIG_GID_INDEXES=//p' /run/sparkrig/gid.env 2>/dev/null "
    "| tail -n 1); echo devices=$(sed -n 's/^SPARKRIG_ROCE_DEVICE_INDEXES=//p' "
    "/run/sparkrig/gid.env 2>/dev/null | tail -n 1)"
)
WEIGHTS = (
    f"out=$({SPARKHOST} verify --mode quick --lock {LOCK} --dest {{weights}} 2>&1); rc=$?; "
    "echo \"$out\" | tail -n 3; echo rc=$rc; find {weights} -name '*.part' 2>/dev/null"
)


def commands() -> list[tuple[str, str]]:
    """What the checks run, for ``--list`` (``{placeholders}`` as in the catalogue)."""
    return [
        ("units (every node, before and after)", UNITS),
        ("serving in order (every node)", ORDER),
        ("completion (on the head, the control machine's key)", COMPLETION),
        ("MTU and GID (every node; live index from the GID table)", FABRIC),
        ("weights (every node)", WEIGHTS),
        ("owned files (control machine)", " ".join(DRY)),
    ]


Units = dict[tuple[str, str], tuple[str, str, str]]  # (node, unit) -> (state, invocation, mono)


def units(guests: Sequence[Guest]) -> Units:
    """Every non-transient sparkrig service on every node, as systemd has it now."""
    out: Units = {}
    for g in guests:
        for line in g.sh(UNITS, check=False).splitlines():
            props = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if props.get("Id") and props.get("Transient") != "yes":
                out[(g.name, props["Id"].removesuffix(".service"))] = (
                    props.get("ActiveState", ""),
                    props.get("InvocationID", ""),
                    props.get("ActiveEnterTimestampMonotonic", ""),
                )
    return out


def restarted(
    before: Units, after: Units, everywhere: Sequence[str], on_target: Sequence[str], target: str
) -> list[str]:
    """Units active before that were restarted or stopped since, and may not have been."""
    problems = []
    for (node, unit), (state, invocation, mono) in sorted(before.items()):
        if state != "active":
            continue
        now = after.get((node, unit), ("gone", "", ""))
        if now[1:] == (invocation, mono) and now[0] == "active":
            continue
        allowed = [*everywhere, *(on_target if node == target else ())]
        if any(fnmatch.fnmatch(unit, pattern) for pattern in allowed):
            continue
        how = "restarted" if now[0] == "active" else f"left {now[0]}"
        problems.append(f"{node}: {unit} {how} (the fault may not touch it)")
    return problems


def in_order(guests: Sequence[Guest]) -> list[str]:
    problems = []
    for g in [*guests[1:], guests[0]]:
        out = g.sh(fill(ORDER, {"unit": g.rank_unit, "container": g.container}), check=False)
        seen = key_values(out)
        if seen.get("state") != "active":
            problems.append(f"{g.name}: {g.rank_unit} is {seen.get('state') or '?'}")
        if seen.get("container") != "true false":
            problems.append(
                f"{g.name}: container {g.container} running/paused: {seen.get('container')}"
            )
        if g.role == "head" and seen.get("peers", "0") == "0":
            problems.append(f"{g.name}: the head's start did not wait for its workers")
    return problems


def key_values(out: str) -> dict[str, str]:
    """``key=value`` lines (what the checks' commands echo), values stripped."""
    return {k: v.strip() for k, _, v in (line.partition("=") for line in out.splitlines()) if _}


def completion(head: Guest) -> list[str]:
    keyfile = control_api_key()
    if not keyfile.exists():
        return [f"no {keyfile.relative_to(REPO)} on the control machine"]
    body = json.dumps({"model": "glm-5.3-flash", "max_tokens": 16,
                       "messages": [{"role": "user", "content": "17*23"}]})  # fmt: skip
    key = shlex.quote(keyfile.read_text().strip())
    command = fill(COMPLETION, {"key": key, "body": shlex.quote(body)})
    out = head.sh(command, check=False, timeout=90)
    try:
        answer = json.loads(out)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return [f"no completion with the control machine's key: {out[:300]!r}"]
    return [] if answer else ["the completion came back empty"]


def fabric(guests: Sequence[Guest]) -> list[str]:
    problems = []
    for g in guests:
        functions = fabric_functions(g)
        if len(functions) > 1:
            problems += both_functions(g, functions)
            continue
        values = {"iface": g.fabric_interface, "container": g.container,
                  "address": g.fabric_address}  # fmt: skip
        seen = key_values(g.sh(fill(FABRIC, values), check=False))
        if seen.get("mtu") != str(FABRIC_MTU):
            problems.append(f"{g.name}: fabric MTU {seen.get('mtu')}, want {FABRIC_MTU}")
        if seen.get("address") != "1":
            problems.append(f"{g.name}: {g.fabric_address} is not on {g.fabric_interface}")
        if seen.get("swappiness") != SWAPPINESS:
            problems.append(f"{g.name}: vm.swappiness {seen.get('swappiness')}, want {SWAPPINESS}")
        try:
            live = str(gid_index_for(g, g.ip))
        except AssertionError as e:
            problems.append(f"{g.name}: no live RoCE v2 GID for {g.ip}: {str(e)[:200]}")
            continue
        for where in ("env", "handed", "container"):
            if seen.get(where) != live:
                problems.append(f"{g.name}: GID index {where}={seen.get(where)!r}, live {live}")
        # the rank started on the RDMA device there now, not on one deleted and made again
        if not seen.get("device_handed") or seen.get("device_handed") != seen.get("device_live"):
            problems.append(
                f"{g.name}: RDMA device index handed={seen.get('device_handed')!r}, "
                f"now {seen.get('device_live')!r} (the device was made again under the rank)"
            )
    return problems


def both_functions(g: Guest, functions: list[tuple[str, str, str]]) -> list[str]:
    """Item 3 on a pair on both functions: each function's MTU, address and live GID, which
    its start gate handed over, its RDMA device not made again; no index pinned in the env."""
    script = "".join(
        fill(FUNCTION, {"i": str(i), "iface": dev, "rdma": rdma, "ip": ip})
        for i, (dev, rdma, ip) in enumerate(functions)
    )
    seen = key_values(g.sh(script + FUNCTIONS, check=False))
    problems = []
    if seen.get("swappiness") != SWAPPINESS:
        problems.append(f"{g.name}: vm.swappiness {seen.get('swappiness')}, want {SWAPPINESS}")
    if seen.get("env"):
        problems.append(f"{g.name}: the env file pins GID index {seen['env']} on both functions")
    handed = rankenv.parse_per_device(seen.get("handed") or "")
    devices = rankenv.parse_per_device(seen.get("devices") or "")
    for i, (dev, rdma, ip) in enumerate(functions):
        if seen.get(f"mtu_{i}") != str(FABRIC_MTU):
            problems.append(f"{g.name}: {dev} MTU {seen.get(f'mtu_{i}')}, want {FABRIC_MTU}")
        if seen.get(f"address_{i}") != "1":
            problems.append(f"{g.name}: {ip} is not on {dev}")
        try:
            live = gid_index_for(g, ip)
        except AssertionError as e:
            problems.append(f"{g.name}: no live RoCE v2 GID for {ip}: {str(e)[:200]}")
            continue
        gid = str(handed[rdma]) if rdma in handed else None  # as the start gate wrote it
        device = str(devices[rdma]) if rdma in devices else None
        if gid != str(live):
            problems.append(f"{g.name}: {rdma} GID index handed={gid!r}, live {live}")
        if device is None or device != seen.get(f"device_live_{i}"):
            problems.append(
                f"{g.name}: {rdma} device index handed={device!r}, now "
                f"{seen.get(f'device_live_{i}')!r} (the device was made again under the rank)"
            )
    return problems


def weights(guests: Sequence[Guest], dest: str) -> list[str]:
    problems = []
    for g in guests:
        out = g.sh(fill(WEIGHTS, {"weights": dest}), check=False, timeout=600)
        if "rc=0" not in out:
            problems.append(f"{g.name}: weights do not verify: {out.strip()[-300:]!r}")
        parts = [line for line in out.splitlines() if line.endswith(".part")]
        if parts:
            problems.append(f"{g.name}: .part left: {', '.join(parts)}")
    return problems


def data_args(data: Sequence[str]) -> list[str]:
    """The operator's ``KEY=VALUE`` data as pyinfra's arguments, ``--data`` before each."""
    return [arg for kv in data for arg in ("--data", kv)]


def planned(timeout: float = 900, data: Sequence[str] = ()) -> tuple[list[str], str]:
    """What the next ``--dry`` would do, one ``host: op`` per planned change; and its output.
    ``data``: the operator's ``--data KEY=VALUE`` arguments, as their runs pass them."""
    argv = [*DRY, *data_args(data)]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYINFRA_PROGRESS": "off"}, check=False)  # fmt: skip
    if run.returncode != 0:
        return [f"--dry failed (rc {run.returncode}): {run.stderr.strip()[-400:]}"], run.stderr
    try:
        found = pyinfra_output.planned(run.stdout)
    except (ValueError, KeyError) as e:
        return [f"--dry --json printed no plan ({e})"], run.stdout + run.stderr
    return [f"--dry plans {p}" for p in found], run.stdout + run.stderr


@dataclass
class Whole:
    problems: list[str]
    dry_output: str


def whole(
    guests: Sequence[Guest],
    dest: str,
    before: Units,
    everywhere: Sequence[str] = (),
    on_target: Sequence[str] = (),
    target: str = "",
    data: Sequence[str] = (),
) -> Whole:
    """Every check, in the order above (``data``: the runs' ``--data`` arguments)."""
    problems = in_order(guests) + completion(guests[0]) + fabric(guests) + weights(guests, dest)
    dry, dry_output = planned(data=data)
    problems += dry
    problems += restarted(before, units(guests), everywhere, on_target, target)
    return Whole(problems, dry_output)

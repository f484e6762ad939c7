"""qemu guests (TCG: /dev/kvm here is PVM, where a stock Debian kernel hangs) and SSH."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from lab import STATE_DIR, fabric, net

MEMORY_MB = 2048
SSH_PORT_BASE = 2221  # lab-head 127.0.0.1:2221, lab-worker1 :2222, ... (guest i: 2220 + i)


def host_names(n: int) -> list[str]:
    return ["lab-head"] + [f"lab-worker{i}" for i in range(1, n)]


def mac(idx: int, nic: int) -> str:
    return f"52:54:00:5a:{idx:02x}:{nic:02x}"


def start(host: dict[str, Any], base: Path, pubkey: str, smp: int, fresh: bool = True) -> int:
    """Boot one guest from a fresh qcow2 overlay on the base image (or, ``fresh=False``, power
    it on again with its disk as it was); return qemu's PID."""
    idx = int(host["index"])
    overlay = Path(host["overlay"])
    if fresh:
        overlay.unlink(missing_ok=True)
    if fresh or not overlay.exists():
        subprocess.run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "qcow2",
                "-b",
                str(base / "base.qcow2"),
                str(overlay),
            ],
            check=True,
        )
    taps = net.tap_names(idx)
    layout, n_hosts = host.get("fabric_layout", "single"), int(host.get("lab_hosts", 2))
    pairs = int(host.get("lab_pairs", 0))  # `lab up --pairs P`; 0: one cluster, as before
    key_b64 = pubkey.split()[1]
    rxe = fabric.rxe_arg(layout, n_hosts, idx, pairs)
    append = (
        "root=/dev/vda rw console=ttyS0 net.ifnames=1 quiet "
        f"sparkrig.host={host['name']} sparkrig.idx={idx} sparkrig.key={key_b64}"
        + (f" {rxe}" if rxe else "")
    )
    argv = [
        "qemu-system-x86_64",
        "-name",
        host["name"],
        "-accel",
        "tcg,tb-size=256",
        "-cpu",
        "max",
        "-m",
        str(MEMORY_MB),
        "-smp",
        str(smp),
        "-kernel",
        str(base / "vmlinuz"),
        "-initrd",
        str(base / "initrd.img"),
        "-append",
        append,
        "-drive",
        f"file={overlay},format=qcow2,if=virtio,cache=unsafe",
        "-display",
        "none",
        "-serial",
        f"file:{host['console_log']}",
        "-monitor",
        "none",
        "-nodefaults",
        "-no-user-config",
    ]
    # addr= pins the PCI slot, which the guest's .link files turn into Spark-like names; the
    # uplinks on slots 7 and 9, the fabric NICs where lab/fabric.py puts them (8 and 10-12)
    nics = [("a", taps["a"], 7), ("b", taps["b"], 9)]
    nics += [(f"f{n.slot:x}", n.tap, n.slot) for n in fabric.nics(layout, n_hosts, idx, pairs)]
    for kind, tap, slot in sorted(nics, key=lambda nic: nic[2]):
        argv += [
            "-netdev",
            f"tap,id=n{kind},ifname={tap},script=no,downscript=no",
            "-device",
            f"virtio-net-pci,netdev=n{kind},mac={mac(idx, slot - 6)},addr={slot:#04x}",
        ]
    return net.spawn(argv, STATE_DIR / f"{host['name']}.qemu.log")


def ssh_argv(state: dict[str, Any], host: dict[str, Any]) -> list[str]:
    return [
        "ssh",
        "-q",
        "-i",
        state["ssh_key"],
        "-p",
        str(host["ssh_port"]),
        "-o",
        f"UserKnownHostsFile={state['known_hosts']}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
        f"{state['ssh_user']}@127.0.0.1",
    ]


def ssh_ok(state: dict[str, Any], host: dict[str, Any], timeout: float = 20) -> bool:
    try:
        r = subprocess.run(ssh_argv(state, host) + ["true"], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def wait_ssh(state: dict[str, Any], timeout: float) -> float:
    """Wait until every guest answers SSH; return the seconds it took."""
    start = time.monotonic()
    pending = {h["name"]: h for h in state["hosts"]}
    while pending:
        for name, host in list(pending.items()):
            if ssh_ok(state, host):
                print(f"  {name}: SSH up after {time.monotonic() - start:.0f} s", flush=True)
                del pending[name]
        elapsed = time.monotonic() - start
        if pending and elapsed > timeout:
            raise SystemExit(
                f"timed out after {elapsed:.0f} s waiting for SSH on {', '.join(pending)}; "
                f"see {STATE_DIR}/<host>.console.log"
            )
        if pending:
            print(f"  waiting for SSH on {', '.join(pending)} ({elapsed:.0f} s)", flush=True)
            time.sleep(10)
    return time.monotonic() - start

"""Fake Sparks for plan tests: pyinfra's @fake connector with canned command output."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.image.fakeimage import converged_image_state

STATE: dict[str, dict[Any, Any]] = {}  # host -> canned responses, set by tests
IMAGE = "registry.example/vllm@sha256:" + "ab" * 32


HEALTHY_GATES = [
    json.dumps({"gate": g, "ok": True, "detail": "ok", "ms": 5})
    for g in ("health", "models", "math", "tool")
]


def node_report(
    *, mtu: int = 1500, ipv4: str = "", swappiness: int = 60, min_free_kbytes: int = 67584
) -> list[str]:
    return [
        "arch=aarch64",
        "kernel=6.11.0-1016-nvidia",
        "gpu=NVIDIA GB10, 12.1, 580.95.05",
        "docker=/usr/bin/docker",
        f"disk_free={3000 * 1024**3}",
        f"memfree_kb={100 * 1024**2}",
        f"swappiness={swappiness}",
        f"min_free_kbytes={min_free_kbytes}",
        "link_present=1",
        "operstate=up",
        "carrier=1",
        f"mtu={mtu}",
        f"ipv4={ipv4}",
        "##SPARKRIG-END##",
    ]


def gid_table(device: str, netdev: str, ip: str | None, index: int = 3) -> list[str]:
    base = f"/sys/class/infiniband/{device}/ports/1"
    lines = [
        f"{base}/gids/0:fe80:0000:0000:0000:0000:0000:0000:0001",
        f"{base}/gid_attrs/types/0:IB/RoCE v1",
        f"{base}/gid_attrs/ndevs/0:{netdev}",
    ]
    if ip:
        a, b, c, d = (int(x) for x in ip.split("."))
        gid = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
        lines += [
            f"{base}/gids/{index}:{gid}",
            f"{base}/gid_attrs/types/{index}:RoCE v2",
            f"{base}/gid_attrs/ndevs/{index}:{netdev}",
        ]
    return lines + ["##SPARKRIG-END##"]


def host(
    name: str,
    ip: str,
    prefix: int = 24,
    responses: dict[Any, Any] | None = None,
    **data: Any,
) -> tuple[str, dict[str, Any]]:
    canned: dict[Any, Any] = dict(responses or {})
    canned.setdefault("grep -H . /sys/class/infiniband", gid_table("rocep1s0f1", "enp1s0f1np1", ip))
    canned.setdefault(re.compile(r"echo \"arch="), node_report())
    canned.setdefault(re.compile(r"sparkrig_gate.py gates"), HEALTHY_GATES)
    # sparkrig's fail_host command: a real shell exits 1 here
    canned.setdefault(re.compile(r">&2; exit 1$"), {"success": False, "stderr": "failed"})
    return (
        f"@fake/{name}",
        {
            "fabric_interface": "enp1s0f1np1",
            "fabric_address": f"{ip}/{prefix}",
            "fake_responses": canned,
            "fake_delay": 0,
            "fake_delay_jitter": 0,
            "base_image": IMAGE,
            "lockfile_dir": "tests/plan/locks",
            "pair_token_file": "tests/plan/pair-token",
            **data,
        },
    )


MODES = {"644": "-rw-r--r--", "600": "-rw-------", "755": "-rwxr-xr-x"}
DIRS = ["/opt/sparkrig", "/opt/sparkrig/bin", "/etc/sparkrig", "/var/lib/sparkrig/models"]
DIRS += ["/var/lib/sparkrig/cache"]


def _stat_matcher(path: str) -> re.Pattern[str]:
    return re.compile(rf"\(test -e {re.escape(path)} \|\|")


def converged(
    uploads: dict[str, bytes],
    units: list[str],
    *,
    ip: str,
    modes: dict[str, str],
    gid_index: int = 3,
    mtu: int = 9000,
) -> dict[Any, Any]:
    """Canned output of a host that already holds ``uploads`` and runs ``units``."""
    import hashlib

    canned: dict[Any, Any] = {}
    for path, data in uploads.items():
        mode = MODES[modes.get(path, "644")]
        canned[_stat_matcher(path)] = (
            f"user=root group=root mode={mode} atime=0 mtime=0 ctime=0 size={len(data)} '{path}'"
        )
        canned[re.compile(rf"sha1sum {re.escape(path)}\b")] = (
            f"{hashlib.sha1(data).hexdigest()}  {path}"
        )
    for path in DIRS:
        canned[_stat_matcher(path)] = (
            f"user=root group=root mode=drwxr-xr-x atime=0 mtime=0 ctime=0 size=4096 '{path}'"
        )
    for unit in units:
        canned[re.compile(rf"--property SubState {re.escape(unit)}")] = [
            f"Id={unit}",
            "SubState=running",
        ]
        canned[re.compile(rf"--property UnitFileState {re.escape(unit)}")] = [
            f"Id={unit}",
            "UnitFileState=enabled",
        ]
    canned["grep -H . /sys/class/infiniband"] = gid_table(
        "rocep1s0f1", "enp1s0f1np1", ip, index=gid_index
    )
    canned[re.compile(r"echo \"arch=")] = node_report(
        mtu=mtu, ipv4=f"{ip}/24" if mtu == 9000 else f"{ip}/24", swappiness=0
    )
    canned["echo rc=$?"] = "rc=0"
    canned["sparkrig-fetch state"] = json.dumps(
        {
            "ok": True,
            "commit": "caca4e6a4ebbd66f159d3d2fc256683fd6e27177",
            "total_files": 2,
            "verified": 2,
            "files_to_fetch": 0,
            "bytes_to_fetch": 0,
        }
    )
    canned.update(converged_image_state(IMAGE))  # base and patched image present
    return canned

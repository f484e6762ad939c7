"""Network-namespace topology for the weights tests and benchmarks (needs root).

    client ns  up0 10.213.1.2/24 ── veth ── dn0 10.213.1.1/24  server ns (lo: 10.213.100.1)
               up1 10.213.2.2/24 ── veth ── dn1 10.213.2.1/24
    root ns    srw<tag>x 10.213.2NN.1/30 ── veth ── ctl0 10.213.2NN.2/30 (control, logs; NN from
               the tag, so a test and a benchmark topology can coexist)

The client gets NetworkManager-style main-table defaults (via up0 metric 100, via up1 metric
600). Download direction shaping: tbf on dn<i> egress (no netem on this kernel).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVER_IP = "10.213.100.1"


def fetch_argv(lock: Path, dest: Path, endpoint: str, *extra: str) -> list[str]:
    """``sparkrig-fetch fetch``'s arguments for ``lock`` into ``dest`` from ``endpoint``, then
    ``extra`` (the tests' and the bench's own timings and uplinks)."""
    return ["fetch", "--lock", str(lock), "--dest", str(dest), "--endpoint", endpoint, *extra]


def serve_argv(src: Path, listen: str, lock: Path, *extra: str) -> list[str]:
    """``sparkrig-fetch serve``'s arguments: ``src``'s lockfile files on ``listen`` for a minute,
    then ``extra``."""
    return ["serve", "--dir", str(src), "--listen", listen, "--lock", str(lock),
            "--max-seconds", "60", *extra]  # fmt: skip


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


class Topo:
    def __init__(self, tag: str = "w", lanes: int = 2):
        self.tag = tag
        self.srv = f"srw{tag}s"
        self.cli = f"srw{tag}c"
        self.lanes = lanes
        self.procs: list[subprocess.Popen[str]] = []
        self.ctl_net = f"10.213.{200 + sum(map(ord, tag)) % 50}"
        self.ctl_ip = f"{self.ctl_net}.2"

    def up_ip(self, i: int) -> str:
        return f"10.213.{i + 1}.2"

    def dn_ip(self, i: int) -> str:
        return f"10.213.{i + 1}.1"

    def __enter__(self) -> Topo:
        self.down()
        sh("ip", "netns", "add", self.srv)
        sh("ip", "netns", "add", self.cli)
        for ns in (self.srv, self.cli):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.srv, "addr", "add", f"{SERVER_IP}/32", "dev", "lo")
        # a router answers ARP only for its own link address, not for "internet" hosts
        sh("ip", "netns", "exec", self.srv, "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1")
        for i in range(self.lanes):
            sh(
                "ip",
                "link",
                "add",
                f"up{i}",
                "netns",
                self.cli,
                "type",
                "veth",
                "peer",
                "name",
                f"dn{i}",
                "netns",
                self.srv,
            )
            sh("ip", "-n", self.cli, "addr", "add", f"{self.up_ip(i)}/24", "dev", f"up{i}")
            sh("ip", "-n", self.srv, "addr", "add", f"{self.dn_ip(i)}/24", "dev", f"dn{i}")
            sh("ip", "-n", self.cli, "link", "set", f"up{i}", "up")
            sh("ip", "-n", self.srv, "link", "set", f"dn{i}", "up")
            sh(
                "ip",
                "-n",
                self.cli,
                "route",
                "add",
                "default",
                "via",
                self.dn_ip(i),
                "dev",
                f"up{i}",
                "metric",
                str(100 if i == 0 else 100 + 500 * i),
            )
        x = f"srw{self.tag}x"
        sh("ip", "link", "add", x, "type", "veth", "peer", "name", "ctl0", "netns", self.srv)
        sh("ip", "addr", "add", f"{self.ctl_net}.1/30", "dev", x)
        sh("ip", "link", "set", x, "up")
        sh("ip", "-n", self.srv, "addr", "add", f"{self.ctl_ip}/30", "dev", "ctl0")
        sh("ip", "-n", self.srv, "link", "set", "ctl0", "up")
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
        self.down()

    def down(self) -> None:
        for ns in (self.srv, self.cli):
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", f"srw{self.tag}x", check=False)

    # -- helpers ------------------------------------------------------------------------------
    def in_ns(self, ns: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def shape(self, i: int, rate_bytes: float, burst: int = 64 * 1024) -> None:
        """tbf on the server side of lane i: the download direction."""
        sh(
            "ip",
            "netns",
            "exec",
            self.srv,
            "tc",
            "qdisc",
            "replace",
            "dev",
            f"dn{i}",
            "root",
            "tbf",
            "rate",
            f"{int(rate_bytes * 8)}bit",
            "burst",
            str(burst),
            "latency",
            "400ms",
        )

    def blackhole(self, i: int, on: bool = True) -> None:
        """Drop the server's replies to lane i (SYN-ACKs and data): a dead uplink."""
        sh(
            "ip",
            "-n",
            self.srv,
            "route",
            "add" if on else "del",
            "blackhole",
            f"{self.up_ip(i)}/32",
        )

    def start_hub(self, root: Path, port: int = 8900, nice: int = 0) -> str:
        p = subprocess.Popen(
            ["nice", "-n", str(nice)]
            + self.in_ns(
                self.srv,
                sys.executable,
                str(ROOT / "lab" / "fakehub.py"),
                "--root",
                str(root),
                "--listen",
                f"0.0.0.0:{port}",
                "--cdn-listen",
                f"0.0.0.0:{port + 1}",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(p)
        ctl = f"http://{self.ctl_ip}:{port}"
        deadline = time.monotonic() + 60  # generous: a loaded CI machine starts Python slowly
        while True:
            try:
                urllib.request.urlopen(ctl + "/_control/whoami", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise RuntimeError("fakehub did not start") from None
                time.sleep(0.05)
        self.ctl = ctl
        return f"http://{SERVER_IP}:{port}"

    def control(self, what: str, data: Any = None, method: str | None = None) -> Any:
        body = json.dumps(data).encode() if data is not None else None
        req = urllib.request.Request(f"{self.ctl}/_control/{what}", data=body, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def fetch_cmd(self, *args: str) -> list[str]:
        return self.in_ns(self.cli, sys.executable, str(ROOT / "files" / "sparkhost"), *args)

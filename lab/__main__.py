"""python3 -m lab up [--hosts N] [--fabric single|ports] [--pairs P] | down | status
| shape --uplink a|b (--rate R | --off) | ssh HOST | poweroff HOST | poweron HOST

Run from the project root, as root."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lab import LAB_DIR, REPO, STATE_DIR, STATE_FILE, fabric, fakehub, image, net, vm

REGISTRY_PORT = 5000
HUB_PORT = 8080
HUB_CDN_PORT = 8081  # LFS downloads redirect here, like the Hub's CDN
# The head's API (api_port, the default 8000: the lab keeps it) forwarded to this loopback port:
# the control machine's bench and the release's bench gate reach it there (lab/inventory.py
# sets the head's api_url to it); with pairs, the n-th head's to API_FORWARD_PORT + n
API_FORWARD_PORT = 28000
HEAD_API_PORT = 8000
BOOT_TIMEOUT_S = 360  # two guests; more share the same host cores under TCG


def boot_timeout(n_hosts: int) -> float:
    """Guests boot together on the host's cores: 4 guests took 387 s and more to SSH on 2 cores."""
    return BOOT_TIMEOUT_S * max(1.0, n_hosts / 2)


def load_state() -> dict[str, Any] | None:
    if not STATE_FILE.exists():
        return None
    state: dict[str, Any] = json.loads(STATE_FILE.read_text())
    return state


def save_state(state: dict[str, Any]) -> None:
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(STATE_FILE)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie or a reused PID does not count
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def ensure_keypair() -> tuple[Path, str]:
    key = STATE_DIR / "id_ed25519"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkrig-lab", "-f", str(key)],
            check=True,
        )
    return key, key.with_suffix(".pub").read_text().strip()


def _started(name: str, pid: int) -> int:
    """Fail fast if a just-started process died (port taken, bad arguments)."""
    time.sleep(0.5)
    if not alive(pid):
        log = STATE_DIR / f"{name}.log"
        tail = log.read_text()[-1500:] if log.exists() else ""
        raise SystemExit(f"{name} exited at start; {log}:\n{tail}")
    return pid


def start_server(state: dict[str, Any], name: str, argv: list[str]) -> int:
    """Run a server inside the lab namespace (e.g. bound to the internet address); its PID is
    recorded in the state so `down` stops it. Log: .lab/<name>.log."""
    pid = net.spawn(argv, STATE_DIR / f"{name}.log", cwd=REPO)
    state["pids"][name] = pid
    save_state(state)
    return _started(name, pid)


# the knobs a stack pins (sparkrig/config/checks.py PIN_KEYS): the keys of each stack_pins entry
PIN_KEYS = ("base_image", "model_repo", "model_revision", "drafter_repo", "drafter_revision")


def stack_pins(
    stack_images: dict[str, str], stack_repos: dict[str, dict[str, str]], knobs: dict[str, Any]
) -> dict[str, dict[str, str]]:
    """The inventory's ``stack_pins``: every stack's stand-in image and fake Hub repos. The
    default stack (vllm-nvfp4) takes the model pins of <hub_root>/knobs.json, so editing that file
    still changes the lab's default weights."""
    pins = {
        stack: {"base_image": image_ref, **stack_repos[stack]}
        for stack, image_ref in stack_images.items()
        if stack in stack_repos
    }
    if "vllm-nvfp4" in pins:
        pins["vllm-nvfp4"].update({k: v for k, v in knobs.items() if k in PIN_KEYS})
    return pins


def repos_to_lock(state: dict[str, Any]) -> list[tuple[str, str]]:
    """(repo, revision) of every model and drafter the lab's inventory can select."""
    pinned = [state["knobs"], *state.get("stack_pins", {}).values()]
    wanted = [(p[f"{kind}_repo"], p[f"{kind}_revision"]) for p in pinned
              for kind in ("model", "drafter") if f"{kind}_repo" in p]  # fmt: skip
    return sorted(set(wanted))


def make_lockfiles(state: dict[str, Any]) -> str:
    """Lock the stand-in's repos (every stack's) the way an operator locks the real ones: the
    real huggingface_hub client against the Hub stand-in (from inside the lab namespace)."""
    from sparkrig.lockfile import lock_name

    locks = STATE_DIR / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    inet = state["internet_address"]
    _wait_port(inet, HUB_PORT, timeout=30)
    for repo, revision in repos_to_lock(state):
        out = locks / lock_name(repo)
        subprocess.run(
            ["ip", "netns", "exec", net.NS, sys.executable, "-m", "sparkrig.lockfile", "refresh",
             "--repo", repo, "--revision", revision, "--endpoint", state["hub_endpoint"],
             "--out", str(out)],
            cwd=REPO, check=True, capture_output=True, text=True,
        )  # fmt: skip
    return str(locks.relative_to(REPO))


def start_fakehub(state: dict[str, Any]) -> int | None:
    """Hook for the Hub stand-in: starts lab/fakehub.py on the internet address if it exists."""
    script = LAB_DIR / "fakehub.py"
    if not script.exists():
        print("hub stand-in: lab/fakehub.py not present, skipped", flush=True)
        return None
    root = Path(state["hub_root"])
    root.mkdir(parents=True, exist_ok=True)
    knobs_file = root / "knobs.json"
    if not knobs_file.exists():  # generate the small model + drafter repos (deterministic)
        gen = subprocess.run(
            [sys.executable, str(script), "--root", str(root), "--generate-only"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        commits: dict[str, str] = json.loads(gen.stdout.strip().splitlines()[-1])
        knobs: dict[str, str] = {}
        for repo, commit in sorted(commits.items()):
            kind = "drafter" if "drafter" in repo else "model"
            knobs[f"{kind}_repo"], knobs[f"{kind}_revision"] = repo, commit
        knobs_file.write_text(json.dumps(knobs, indent=2) + "\n")
    stacks_file = root / "stacks.json"
    # a model + drafter per stack (vllm-nvfp4: the pair above); again when a stack was added
    stale = stacks_file.exists() and set(json.loads(stacks_file.read_text())) != set(
        fakehub.STACK_REPOS
    )
    if stale or not stacks_file.exists():
        gen = subprocess.run(
            [sys.executable, str(script), "--root", str(root), "--generate-stacks"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        stacks_file.write_text(gen.stdout.strip().splitlines()[-1] + "\n")
    inet = state["internet_address"]
    argv = [
        sys.executable, str(script), "--root", str(root),
        "--listen", f"{inet}:{HUB_PORT}", "--cdn-listen", f"{inet}:{HUB_CDN_PORT}",
    ]  # fmt: skip
    pid = start_server(state, "fakehub", argv)
    print(f"hub stand-in: {state['hub_endpoint']} (pid {pid})", flush=True)
    return pid


def _wait_port(addr: str, port: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                net.NS,
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(('{addr}', {port}), 1)",
            ],
            capture_output=True,
        )
        if r.returncode == 0:
            return True
        time.sleep(0.5)
    return False


def host_records(n_hosts: int, fabric_layout: str, pairs: int = 0) -> list[dict[str, Any]]:
    """The state's ``hosts``, before any guest runs (qemu_pid None): guest i's names, ports and
    addresses; with ``pairs``, each host's pair (lab/fabric.py ``pair_hosts``)."""
    members = (
        fabric.pair_hosts(pairs)
        if pairs
        else [
            (name, "head" if i == 0 else "worker", "")
            for i, name in enumerate(vm.host_names(n_hosts))
        ]
    )
    hosts = []
    for i, (name, role, pair) in enumerate(members):
        idx = i + 1
        nics = fabric.nics(fabric_layout, n_hosts, idx, pairs)
        host: dict[str, Any] = {
            "name": name,
            "role": role,
            "index": idx,
            "ssh_port": vm.SSH_PORT_BASE + i,
            "mgmt_address": f"{net.UPLINKS['a']['prefix']}.{10 + idx}",
            "fabric_layout": fabric_layout,
            "lab_hosts": n_hosts,
            # the first fabric NIC and address (the plan's first in the ports layout)
            "fabric_interface": nics[0].netdev,
            "fabric_address": fabric.first_address(fabric_layout, n_hosts, idx, pairs),
            "roce_device": nics[0].rdma,
            "fabric_nics": [
                {"netdev": n.netdev, "rdma": n.rdma, "tap": n.tap, "bridge": n.bridge} for n in nics
            ],
            "uplink_interfaces": ["enP7s7", "enP9s9"],
            "uplink_addresses": {
                str(up["interface"]): f"{up['prefix']}.{10 + idx}" for up in net.UPLINKS.values()
            },
            "overlay": str(STATE_DIR / f"{name}.qcow2"),
            "console_log": str(STATE_DIR / f"{name}.console.log"),
            "qemu_pid": None,
        }
        if pairs:
            host.update(pair=pair, lab_pairs=pairs)
        hosts.append(host)
    return hosts


def api_forward_ports(hosts: list[dict[str, Any]]) -> dict[str, int]:
    """Every head's loopback port for its API: the first head's API_FORWARD_PORT (as ever), the
    next head's the port after it."""
    heads = [h["name"] for h in hosts if h["role"] == "head"]
    return {name: API_FORWARD_PORT + i for i, name in enumerate(heads)}


def forward_specs(hosts: list[dict[str, Any]]) -> list[str]:
    """lab.forward's arguments: every guest's SSH, then every head's API."""
    specs = [f"{h['ssh_port']}={h['mgmt_address']}:22" for h in hosts]
    by_name = {h["name"]: h for h in hosts}
    for name, port in api_forward_ports(hosts).items():
        specs.append(f"{port}={by_name[name]['mgmt_address']}:{HEAD_API_PORT}")
    return specs


def up(n_hosts: int, smp: int, fabric_layout: str | None = None, pairs: int = 0) -> None:
    if pairs:
        try:
            fabric.check_pairs(pairs, fabric_layout or "cable", n_hosts)
        except ValueError as e:
            raise SystemExit(f"--pairs: {e}") from None
    if n_hosts < 2:
        raise SystemExit("the lab needs at least 2 hosts (head + worker)")
    fabric_layout = fabric_layout or ("cable" if pairs else fabric.default_layout(n_hosts))
    if fabric_layout not in fabric.LAYOUTS:
        raise SystemExit(f"--fabric: one of {', '.join(fabric.LAYOUTS)}")
    if fabric_layout == "cable" and n_hosts != 2 and not pairs:
        raise SystemExit("--fabric cable: a pair's one cable, two hosts (--hosts 2)")
    state = load_state()
    if state is not None:
        running = [h for h in state["hosts"] if alive(h.get("qemu_pid"))]
        same = state.get("fabric_layout", "single") == fabric_layout
        same = same and int(state.get("pairs", 0)) == pairs
        if running and same and len(state["hosts"]) == n_hosts and len(running) == n_hosts:
            print(f"lab already up with {n_hosts} hosts; reusing it", flush=True)
            vm.wait_ssh(state, boot_timeout(n_hosts))
            return
        if running:
            raise SystemExit(
                f"lab is up with {len(state['hosts'])} hosts"
                + (f" as {state['pairs']} pairs" if state.get("pairs") else "")
                + ": run `python3 -m lab down` first"
            )
        print("stale lab state found: cleaning up first", flush=True)
        down(quiet=True)
    elif net.exists():
        down(quiet=True)

    t0 = time.monotonic()
    STATE_DIR.mkdir(exist_ok=True)
    for old in STATE_DIR.glob("*.log"):
        old.unlink()
    base = image.ensure_base()
    key, pubkey = ensure_keypair()
    host_keys = [k.split()[:2] for k in (base / "host_keys.pub").read_text().splitlines() if k]
    known_hosts = STATE_DIR / "known_hosts"
    known_hosts.write_text(
        "".join(
            f"[127.0.0.1]:{vm.SSH_PORT_BASE + i} {kind} {blob}\n"
            for i in range(n_hosts)
            for kind, blob in host_keys
        )
    )
    inet = net.INTERNET
    state = {
        "version": 1,
        "status": "starting",
        "namespace": net.NS,
        "suite": (base / "suite").read_text().strip(),
        "base_dir": str(base),
        "internet_address": inet,
        "registry": f"{inet}:{REGISTRY_PORT}",
        "hub_endpoint": f"http://{inet}:{HUB_PORT}",
        "hub_cdn": f"http://{inet}:{HUB_CDN_PORT}",
        "hub_root": str(STATE_DIR / "hub"),
        "image": None,
        "image_digest": None,
        "ssh_user": "spark",
        "ssh_key": str(key),
        "known_hosts": str(known_hosts),
        "fabric_layout": fabric_layout,
        "fabric_subnet": f"{net.FABRIC_PREFIX}.0/24",
        "fabric_mtu_bridge": net.FABRIC_MTU,
        "uplinks": {
            name: {
                "interface": up["interface"],
                "bridge": up["bridge"],
                "subnet": f"{up['prefix']}.0/24",
                "gateway": f"{up['prefix']}.1",
                "metric": up["metric"],
            }
            for name, up in net.UPLINKS.items()
        },
        "pids": {},
        "hosts": [],
        "knobs": {},
    }
    if pairs:
        state["pairs"] = pairs
    state["hosts"] = host_records(n_hosts, fabric_layout, pairs)
    save_state(state)

    print(f"network: namespace {net.NS}, internet address {inet}", flush=True)
    net.create(n_hosts, fabric_layout, pairs)

    # the stock stand-in, its failing and slow variants (30% slower: the bench gate's lab test)
    # and one image per engine flavour, each stack's among them
    state["image_digest"] = image.build_standin(base, STATE_DIR / "registry")
    state.update(image.standin_refs(state["registry"], STATE_DIR / "registry"))
    start_server(
        state,
        "registry",
        [
            sys.executable,
            str(LAB_DIR / "registry.py"),
            "--listen",
            state["registry"],
            "--root",
            str(STATE_DIR / "registry"),
        ],
    )
    start_fakehub(state)
    knobs_file = Path(state["hub_root"]) / "knobs.json"
    if knobs_file.exists():  # written by whoever generates the Hub stand-in's repos
        state["knobs"].update(json.loads(knobs_file.read_text()))
        stacks_file = Path(state["hub_root"]) / "stacks.json"
        if stacks_file.exists():
            repos = json.loads(stacks_file.read_text())
            state["stack_pins"] = stack_pins(state["stack_images"], repos, state["knobs"])
        state["knobs"]["lockfile_dir"] = make_lockfiles(state)

    forwards = forward_specs(state["hosts"])
    state["api_forward_port"] = API_FORWARD_PORT  # the first head's
    state["api_forward_ports"] = api_forward_ports(state["hosts"])
    state["pids"]["forwarder"] = net.spawn(
        [sys.executable, "-m", "lab.forward", *forwards],
        STATE_DIR / "forwarder.log",
        cwd=REPO,
        in_ns=False,
    )
    save_state(state)
    _started("forwarder", state["pids"]["forwarder"])

    as_pairs = f" as {pairs} pairs" if pairs else ""
    print(f"booting {n_hosts} guests{as_pairs} under TCG (about {n_hosts} min to SSH)", flush=True)
    tb = time.monotonic()
    for host in state["hosts"]:
        host["qemu_pid"] = vm.start(host, base, pubkey, smp)
        save_state(state)
    if not _wait_port(inet, REGISTRY_PORT):
        print(f"warning: registry not answering; see {STATE_DIR}/registry.log", flush=True)
    vm.wait_ssh(state, boot_timeout(n_hosts))
    state["status"] = "up"
    state["boot_to_ssh_s"] = round(time.monotonic() - tb)
    save_state(state)
    print(f"lab up in {time.monotonic() - t0:.0f} s (boot to SSH {state['boot_to_ssh_s']} s)")
    status()


def _kill(pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    # give init a moment to reap them, so `ps` shows no <defunct> qemu either
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)


def down(quiet: bool = False) -> None:
    state = load_state()
    pids: list[int] = []
    if state:
        pids += [int(h["qemu_pid"]) for h in state["hosts"] if h.get("qemu_pid")]
        pids += [int(p) for p in state["pids"].values() if p]
    pids += net.ns_pids()  # anything else the lab started in its namespace
    _kill(sorted(set(pids)))
    net.destroy()
    if state:
        for h in state["hosts"]:
            Path(h["overlay"]).unlink(missing_ok=True)
    STATE_FILE.unlink(missing_ok=True)
    left = [p for p in pids if alive(p)]
    if left:
        raise SystemExit(f"lab down: processes still alive: {left}")
    if not quiet:
        print(f"lab down: stopped {len(set(pids))} processes, removed namespace {net.NS}")


def _guest(state: dict[str, Any], name: str) -> dict[str, Any]:
    host = next((h for h in state["hosts"] if h["name"] == name), None)
    if host is None:
        raise SystemExit(f"no host {name}")
    return host


def poweroff(name: str) -> None:
    """Power one guest off as a pulled plug would (qemu quits; its disk is kept)."""
    state = load_state()
    if state is None:
        raise SystemExit("lab is not up: run python3 -m lab up")
    host = _guest(state, name)
    _kill([int(host["qemu_pid"])] if host.get("qemu_pid") else [])
    host["qemu_pid"] = None
    save_state(state)
    print(f"{name}: powered off")


def poweron(name: str, smp: int = 1) -> None:
    """Power a guest that was powered off on again, with its disk as it was; wait for SSH."""
    state = load_state()
    if state is None:
        raise SystemExit("lab is not up: run python3 -m lab up")
    host = _guest(state, name)
    if alive(host.get("qemu_pid")):
        raise SystemExit(f"{name} is already running")
    base = Path(state["base_dir"])
    _, pubkey = ensure_keypair()
    host["qemu_pid"] = vm.start(host, base, pubkey, smp, fresh=False)
    save_state(state)
    vm.wait_ssh({**state, "hosts": [host]}, BOOT_TIMEOUT_S)
    print(f"{name}: powered on")


def status() -> None:
    state = load_state()
    if state is None:
        print("lab is not up (no .lab/state.json)")
        sys.exit(1)
    print(
        f"namespace {state['namespace']}  internet {state['internet_address']}  "
        f"status {state['status']}"
    )
    print(f"hub      {state['hub_endpoint']}  (pid {state['pids'].get('fakehub', '-')})")
    print(f"image    {state['image']}")
    for stack, ref in state.get("stack_images", {}).items():
        print(f"stack    {stack:<12} {ref}")
    for up, desc in net.shaping().items():
        print(f"uplink {up}  {desc}")
    ok_all = True
    for h in state["hosts"]:
        running = alive(h.get("qemu_pid"))
        ok = running and vm.ssh_ok(state, h)
        ok_all &= ok
        layout = h.get("fabric_layout", "single")
        nics = ", ".join(f"{n['netdev']}@{n['bridge']}" for n in h.get("fabric_nics", []))
        typed = f"fabric {h['fabric_interface']} -> {h['fabric_address']}"
        pair = f"{h['pair']:<7} " if h.get("pair") else ""
        print(
            f"{h['name']:<12} {h['role']:<6} {pair}ssh 127.0.0.1:{h['ssh_port']}  "
            f"qemu {'running' if running else 'STOPPED'}  ssh {'ok' if ok else 'NO'}  "
            + {"single": typed, "cable": f"{typed} (+ twin): {nics}"}.get(layout, f"fabric {nics}")
        )
    if not ok_all:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m lab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build (cached) and boot the lab, wait for SSH")
    p_up.add_argument(
        "--hosts", type=int, default=None, help="number of guests (first is head; default 2)"
    )
    p_up.add_argument("--smp", type=int, default=1, help="vCPUs per guest")
    p_up.add_argument(
        "--fabric",
        choices=fabric.LAYOUTS,
        default=None,
        help="cable (default for 2 hosts): both functions of the pair's cable, the inventory of "
        "today's form; single (default for more): one fabric NIC per guest on one bridge (a "
        "switch); ports: both functions of each cabled port, every address derived (a pair, or "
        "a triangle or a ring cabled port 0 to the next guest's port 1: lab/fabric.py)",
    )
    p_up.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="P pairs behind one endpoint (2 to 4; guests 2p+1 head and 2p+2 worker of pair p: "
        "pair_a, pair_b, ...), each pair cabled as --fabric cable on segments of its own",
    )
    sub.add_parser("down", help="stop everything and delete the namespace and overlays")
    sub.add_parser("status", help="hosts, ports, SSH reachability (exit 1 if not all up)")
    p_sh = sub.add_parser("shape", help="tbf-shape traffic towards the guests on one uplink")
    p_sh.add_argument("--uplink", choices=sorted(net.UPLINKS), required=True)
    g = p_sh.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", help="tc rate, e.g. 88mbit")
    g.add_argument("--off", action="store_true")
    sub.add_parser("poweroff", help="pull one guest's plug (its disk is kept)").add_argument("host")
    sub.add_parser("poweron", help="power a guest on again and wait for SSH").add_argument("host")
    p_ssh = sub.add_parser("ssh", help="ssh into a guest as spark")
    p_ssh.add_argument("host", nargs="?", default="lab-head")
    p_ssh.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root (namespaces, taps)")
    if args.cmd == "up":
        try:
            hosts = args.hosts if args.hosts is not None else 2 * (args.pairs or 1)
            up(hosts, args.smp, args.fabric, args.pairs)
        except BaseException:
            print("lab up failed: run `python3 -m lab down` to clean up", file=sys.stderr)
            raise
    elif args.cmd == "down":
        down()
    elif args.cmd == "status":
        status()
    elif args.cmd == "shape":
        if not net.exists():
            raise SystemExit("lab is not up: run python3 -m lab up")
        print(net.shape(args.uplink, None if args.off else args.rate))
    elif args.cmd == "poweroff":
        poweroff(args.host)
    elif args.cmd == "poweron":
        poweron(args.host)
    elif args.cmd == "ssh":
        state = load_state()
        if state is None:
            raise SystemExit("lab is not up: run python3 -m lab up")
        host = next((h for h in state["hosts"] if h["name"] == args.host), None)
        if host is None:
            raise SystemExit(f"no host {args.host}")
        argv = vm.ssh_argv(state, host) + args.command
        os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()

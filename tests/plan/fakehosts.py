"""Fake Sparks for plan tests: pyinfra's @fake connector with every command declared.

pyinfra's fake connector answers a command nobody declared with success and no output, which
would let a plan test pass whatever the deploy sends. Here every command the deploy may send
has an entry (``bare``: a DGX OS node sparkrig never touched, where every action succeeds), and
tests/plan/harness.py fails the test on any other command. Tests put their own entries first
(a converged node, an injected failure): the first matching entry wins.

The converged state of a node (``converged``) is rendered from the templates, programs and
lockfiles by the functions the deploy calls, and hashed the way pyinfra's facts read it; it
never comes from what an earlier run uploaded."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from sparkrig import hostpkg
from sparkrig.config.model import Settings
from sparkrig.factlines import END
from sparkrig.image import MARKER
from sparkrig.release import LISTING
from tests.image.fakeimage import converged_image_state, image_state

ROOT = Path(__file__).resolve().parents[2]
STATE: dict[str, dict[Any, Any]] = {}  # host -> canned responses, set by tests
IMAGE = "registry.example/vllm@sha256:" + "ab" * 32
# the pair's CA of the fake pairs: made by the first plan of a session (git ignores it)
TLS_DIR = "tests/plan/tls"
COMMIT = "caca4e6a4ebbd66f159d3d2fc256683fd6e27177"  # tests/plan/locks
HCA = "rocep1s0f1"

HEALTHY_GATES = [
    json.dumps({"gate": g, "ok": True, "detail": "ok", "ms": 5})
    for g in ("health", "models", "math", "tool", "locked")
]
FAILED = {"success": False, "stderr": "failed"}


def node_report(
    *,
    mtu: int = 1500,
    ipv4: str = "",
    swappiness: int = 60,
    min_free_kbytes: int = 67584,
    docker: str = "/usr/bin/docker",
    disk_free: int = 3000 * 1024**3,
    carrier: int = 1,
    admin_up: bool = True,
    claims: tuple[str, ...] = (),
    netdevs: str | None = None,
    memtotal_kb: int = 119 * 1024**2,  # a DGX Spark's 128 GB
) -> list[str]:
    """``netdevs``: the fabric NIC is missing and the host has these (``name:operstate,...``)."""
    link = [
        "link_present=1",
        f"operstate={'up' if carrier else 'down'}",
        f"flags={'0x1003' if admin_up else '0x1002'}",  # IFF_UP (0x1) or not
        f"carrier={carrier}",
        f"mtu={mtu}",
        f"ipv4={ipv4}",
    ]
    return [
        "arch=aarch64",
        "kernel=6.11.0-1016-nvidia",
        "gpu=NVIDIA GB10, 12.1, 580.95.05",
        f"docker={docker}",
        f"disk_free={disk_free}",
        f"memtotal_kb={memtotal_kb}",
        f"memfree_kb={100 * 1024**2}",
        f"swappiness={swappiness}",
        f"min_free_kbytes={min_free_kbytes}",
        *(link if netdevs is None else ["link_present=0", f"netdevs={netdevs}"]),
        "networkmanager=active",
        *claims,
        "##SPARKRIG-END##",
    ]


SPARK_KERNEL = "6.11.0-1016-nvidia"
SPARK_PACKAGES = (  # the kernel and driver packages of a DGX OS node (names: sparkrig/baseline.py)
    ("linux-image-{k}", "{v}"),
    ("linux-modules-{k}", "{v}"),
    ("linux-headers-{k}", "{v}"),
    ("linux-image-nvidia-hwe-24.04", "{v}"),
    ("linux-nvidia-hwe-24.04", "{v}"),
    ("linux-modules-nvidia-580-open-{k}", "{v}"),
    ("nvidia-driver-580-open", "580.95.05-0ubuntu1"),
    ("libnvidia-compute-580", "580.95.05-0ubuntu1"),
)


def baseline_report(
    *,
    kernel: str = SPARK_KERNEL,
    driver: str = "580.95.05",
    nic_fw: str = "28.45.4028",
    kho: tuple[str, ...] = (),
    cmdline: str = "BOOT_IMAGE=/boot/vmlinuz-{k} root=UUID=0000 ro quiet splash",
    held: bool = False,
    grub_kho: bool = False,
) -> list[str]:
    """sparkrig.baseline.Baseline's output for a DGX Spark: ``kho`` the CONFIG_KEXEC_HANDOVER
    lines of its kernel config, ``held`` whether its kernel and driver packages are held."""
    version = kernel.replace("-nvidia", "").replace("-", ".", 1)
    want = "h" if held else "i"
    packages = [
        f"pkg={want}i |{name.format(k=kernel)}|{v.format(v=version)}" for name, v in SPARK_PACKAGES
    ]
    return [
        f"kernel={kernel}",
        f"cmdline={cmdline.format(k=kernel)}",
        f"driver_module={driver}",
        f"driver_proc=NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {driver}  "
        "Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Sep 18 20:36:04 UTC 2025",
        f"nic_fw={nic_fw}",
        "dmi_bios_vendor=NVIDIA",
        "dmi_bios_version=5.36_0ACUM018",
        "dmi_bios_date=09/12/2025",
        "dmi_sys_vendor=NVIDIA",
        "dmi_product_name=DGX Spark",
        "dmi_board_name=P4242",
        *kho,
        *(["grub_kho=1"] if grub_kho else []),
        *packages,
        "pkg=ii |linux-firmware|20240318.git3b128b60-0ubuntu2.17",
        "pkg=ii |docker-ce|5:28.3.3-1~ubuntu.24.04~noble",
        "pkg=ii |nvidia-container-toolkit|1.17.8-1",
        "pkg=un |docker.io|",
        "##SPARKRIG-END##",
    ]


KHO_DEFAULT_ON = ("CONFIG_KEXEC_HANDOVER=y", "CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y")


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


# ---------------------------------------------------------------------------------------------
# Matchers, one per kind of command the deploy sends
# ---------------------------------------------------------------------------------------------

OURS = r"/\S*sparkrig\S*"  # every path sparkrig owns has "sparkrig" in it
UNITS_KNOWN = [
    "sparkrig-head", "sparkrig-worker", "sparkrig-pair", "sparkrig-agent", "sparkrig-watchdog",
    "sparkrig-supervisor", "sparkrig-gpu-clock", "sparkrig-firewall", "sparkrig-relay",
]  # fmt: skip


def fact_script(name: str) -> re.Pattern[str]:
    """A fact's script of sparkrig/facts/ (factlines.script_command), known by its ``$0``."""
    return re.compile(rf"^sh -c '.*' sparkrig-{name}( |$)", re.S)


NODE = fact_script("node")  # sparkrig/node.py: the node report
GIDS = re.compile(r"^grep -H \. /sys/class/infiniband/\*/ports/\*/gids/\* ")
RANK_STATUS = re.compile(r"echo \"gid_env=\$\(sed ")  # status.py's one read per rank
# status.py's read of what explains a rank with something off (files/sparkhost/why.py)
WHY = re.compile(r"^/usr/bin/python3 \S+/lib/sparkhost why --unit \S+ .* 2>&1 \|\| true$")
WHY_SAYS = ["why: firewall: nothing dropped on the fabric", "why: peer 192.168.100.10: beacon up"]
RANK_RUNTIME = re.compile(r'^echo "container=\$\(timeout 20 docker inspect ')  # serving.RankRuntime
# what a rank's engine loaded (sparkhost runtime): DGX OS's libnccl2 2.28.9
ENGINE_RUNTIME = re.compile(r"^/usr/bin/python3 \S+/lib/sparkhost runtime --container ")
SOAK = re.compile(r"^/usr/bin/python3 \S+/lib/sparkhost soak ")  # the release's soak gate
SOAK_HELD = {"ok": True, "minute": None, "detail": "held 30 min under 4 streams", "requests": 1210,
             "failed": 0, "tokens": 77440, "tok_s": 43.02, "p50_s": 5.61, "p99_s": 7.9,
             "stalls": 0, "minutes": 30, "streams": 4}  # fmt: skip
RUNTIME_SAYS = {
    "processes": 12,
    "nccl": [
        {
            "path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9",
            "version": "2.28.9",
            "cuda": "13.0",
            "build_id": "c0db9360" + "0" * 32,
            "sha256": "5" * 64,
            "bytes": 190 << 20,
        }
    ],  # fmt: skip
    "cudart": [{"path": "/usr/local/cuda/lib64/libcudart.so.13", "version": "13"}],
    "driver": "580.95.05",
    "cma_total_kb": 0,
    "cma_free_kb": 0,
}
PAIR_SECRET = re.compile(r"^if \[ -s /etc/sparkrig/pair-token \]; then sha256sum ")  # its digest
API_KEY = re.compile(r"^if \[ -s /etc/sparkrig/api-key \]; then sha256sum ")  # the head's key's
API_KEY_ENV = re.compile(r"^if \[ -s /etc/sparkrig/api-key.env \]; then sha256sum ")  # vLLM's
FRONT_CERT = re.compile(r"^if \[ -s /etc/sparkrig/api-front.crt \]; then sha256sum ")  # the front's
SECRET_WRITE = re.compile(r"^sh -c 'umask 077 && t=")  # a secret written through stdin (secretio)
SECRET_READ = re.compile(r"^cat /etc/sparkrig/")  # a secret read at apply time, never printed


def held(text: str) -> list[str]:
    """SecretDigest's answer for a host holding ``text`` (stripped; "" none)."""
    from sparkrig.secretio import Held

    h = Held.of(text)
    return [h.sha256, str(h.chars), END] if h else [END]


RELEASE = re.compile(re.escape(LISTING))  # the release record and weights_dir's entries
BASELINE = fact_script("baseline")  # sparkrig/baseline.py
REACH = re.compile(r"^/usr/bin/python3 -c '\nimport ssl, sys, urllib")  # sparkrig/reach.py
FRONT = re.compile(r"^if dpkg-query -W -f='\$\{Status\}' nginx ")  # sparkrig/front.py
FRONT_INSTALL = re.compile(r"^sh -c 'set -e; \{ DEBIAN_FRONTEND=noninteractive apt-get install ")
FRONT_CHECK = re.compile(r"^nginx -t -q$")
# behind one endpoint: the drain include written, the front reloaded (sparkrig/drain.py)
FRONT_DRAIN = re.compile(r"^printf '%s' '# sparkrig: 1 while this pair drains ")
FRONT_ASIDE = re.compile(r"^grep -qF -- '--host 127\.0\.0\.1' ")
FRONT_OFF = re.compile(r"^if \[ -e /var/lib/sparkrig/nginx-installed-by-sparkrig \]; then ")
FRONT_UNIT = re.compile(r"^systemctl (start|stop|enable|disable|reload|restart) nginx\.service")
PORTS = fact_script("ports")  # sparkrig/ports.py: who listens on sparkrig's ports
FIREWALL = fact_script("firewall")  # sparkrig/firewall.py: nft, the table
FIREWALL_COUNTERS = re.compile(r"^sh -c 'nft list table inet sparkrig ")  # status.py's counters


def firewall_state(nft: bool = True, loaded: bool = False) -> list[str]:
    """sparkrig.firewall.FirewallState's output."""
    if not nft:
        return ["nft=missing", END]
    return ["nft=yes", f"table={'loaded' if loaded else 'absent'}", END]


def firewall_listing(s: Settings, dropped: int = 0) -> list[str]:
    """``nft list table inet sparkrig`` of the rank's loaded ruleset, each drop counting
    ``dropped`` packets (what status.py reads)."""
    from sparkrig.firewall import ruleset

    out = []
    for line in ruleset(s).splitlines():
        if line.lstrip().startswith("#") or line.startswith(("table inet sparkrig {}", "delete")):
            continue
        out.append(line.replace("counter drop", f"counter packets {dropped} bytes 0 drop"))
    return out


HUB_API = "https://huggingface.co/api/models/LibertAIDAI/GLM-5.3-Flash-NVFP4"
REGISTRY_API = "https://registry.example/v2/"
ARCHIVE = "http://ports.ubuntu.com/ubuntu-ports/"  # DGX OS's apt archive (Ubuntu on arm64)


def reached(hub: str = "401", registry: str = "401", archive: str = "200") -> list[str]:
    """sparkrig.reach.Reach's output: ``ok <url> <status>`` or ``fail <url> <why>`` (a status
    is a number, anything else a reason the URL was not reached)."""
    out = []
    for url, said in ((HUB_API, hub), (REGISTRY_API, registry), (ARCHIVE, archive)):
        out.append(f"{'ok' if said.isdigit() else 'fail'} {url} {said}")
    return [*out, END]


def listening(
    port: int, program: str, pid: int, unit: str = "", container: str = "", address: str = "*"
) -> str:
    """One listener as sparkrig.ports.Listeners prints it: held by a systemd unit (``unit``)
    or a docker container (``container``: its cgroup is docker's scope of its id)."""
    cgroup = f"/system.slice/{unit}" if unit else ""
    if container:
        cgroup = f"/system.slice/docker-{hashlib.sha256(container.encode()).hexdigest()}.scope"
    return f"listen={address}:{port}|{pid}|{program}|{cgroup}|{container}"


def converged_listeners(s: Settings) -> list[str]:
    """A serving rank's listeners: its container (the head: API and rendezvous), its beacon,
    the worker's agent or the head's supervisor."""
    k = s.knobs
    out = [listening(k.pair_port, "python3", 2101, unit="sparkrig-pair.service", address=s.me.ip)]
    helper = "sparkrig-supervisor.service" if s.me.is_head else "sparkrig-agent.service"
    out.append(listening(k.agent_port, "python3", 2102, unit=helper, address=s.me.ip))
    if s.me.is_head:
        out.append(listening(k.api_port, "nginx", 3000, unit="nginx.service", address="0.0.0.0"))
        out.append(listening(k.engine_port, "vllm", 3100, container=s.container_name,
                             address="127.0.0.1"))  # fmt: skip
        out.append(listening(k.master_port, "vllm", 3100, container=s.container_name))
    return [*out, END]


def release_state(record: str = "", entries: tuple[str, ...] = ()) -> list[str]:
    """sparkrig.release.ReleaseState's output: release.json (if any), then weights_dir's entries
    as "<kind> <name>" lines."""
    return [*record.splitlines(), "", LISTING, *entries, "##SPARKRIG-END##"]


def serving_recorded(short: str, **fields: Any) -> None:
    """Change fields (e.g. ``fabric``, ``bench``) of the serving release in the converged rank
    ``short``'s release record, as a later run reads it."""
    from dataclasses import replace

    from sparkrig.release import parse_record, record_text

    lines = STATE[short][RELEASE]
    cut = lines.index("")
    record = parse_record("\n".join(lines[:cut]))
    kept = (replace(record[0], **fields), *record[1:])
    inject(short, {RELEASE: release_state(record_text(kept), tuple(lines[cut + 2 : -1]))})


def rank_status(
    gids: tuple[str, ...] = (), baseline: list[str] | None = None, record: str = "", **values: Any
) -> list[str]:
    """sparkrig.status.RankStatus's output: key=value lines, the GID table's lines (``gids``),
    the host baseline's lines (``baseline``: the Baseline fact's output, prefixed), the release
    record on one line (``record``), then the end marker."""
    from sparkrig.factlines import END
    from sparkrig.status import BASELINE_PREFIX

    ours = [BASELINE_PREFIX + x for x in baseline or []]
    out = [f"{key}={value}" for key, value in values.items()] + [*gids, *ours]
    return [*out, f"release_record={record}", END]


PING_CHECK = re.compile(r"^ping -M do .* 2>&1; echo rc=\$\?$")
PING = re.compile(
    r"^ping -M do -s \d+ -c 2 -i 0\.2 -W 2 -I \S+ [\d.]+ >/dev/null & p0=\$!; .*wait \$p\d+$"
)
NETPLAN_GENERATE = re.compile(r"^netplan generate$")
NM_RELOAD = re.compile(r"^nmcli connection reload$")
NM_UP = re.compile(r"^nmcli --wait \d+ connection up netplan-\S+$")
DISPLACE = re.compile(r"^install -d -m 700 \$\(dirname /var/lib/sparkrig/displaced/")
SYSCTL = re.compile(r"^sysctl -p /etc/sysctl\.d/90-sparkrig\.conf$")
WEIGHTS_STATE = re.compile(r"^test -f \S+/lib/sparkhost/state\.py && test -f \S+\.lock\.json && ")
FETCH = re.compile(
    r"^\(systemctl is-active --quiet sparkrig-fetch-(model|drafter) \|\| systemd-run"
)
PACKAGE = r"/usr/bin/python3 \S+/lib/sparkhost"  # every host program (sparkrig/hostpkg.py)
REHASH = re.compile(rf"^{PACKAGE} verify --mode full --lock ")  # weights_verify = full
WEIGHTS_SERVE = re.compile(r"^systemctl stop sparkrig-weights-serve 2>/dev/null; systemd-run ")
IMAGE_FACT = re.compile(re.escape(MARKER))
SAVED_TAR = re.compile(r"^cat /var/lib/sparkrig/images/base-\w+\.digest ")  # read over SSH
SMOKE_CLEAN = re.compile(r"^docker rm --force sparkrig-nccl-smoke >/dev/null 2>&1 \|\| true$")
SMOKE_WORKER = re.compile(r"^docker run --detach --name sparkrig-nccl-smoke ")
SMOKE_HEAD = re.compile(r"^docker run --rm --name sparkrig-nccl-smoke ")
SMOKE_CHECK = re.compile(r"^rc=\$\(docker wait sparkrig-nccl-smoke\); ")
# the head's waits run `sparkhost why` after them when they fail (sparkrig/bringup.py explained)
EXPLAINED = rf" \|\| \{{ rc=\$\?; {PACKAGE} why --unit .*; exit \$rc; \}}'$"
PAIR_WAIT = re.compile(
    rf"^sh -c '{PACKAGE} pair wait --peers [\d.,]+ --port \d+ --timeout \d+{EXPLAINED}"
)
# a worker's deploy without the head asks the head's supervisor for the ordered restart
PAIR_REQUEST = re.compile(rf"^{PACKAGE} pair request --head [\d.]+ --port \d+ --agent-port \d+ ")
ROUTES_REPAIR = re.compile(rf"^{PACKAGE} routes (--uplink=\S+ )+--repair$")  # an upgrade's repair
BOOT_WAIT = re.compile(rf"^sh -c '{PACKAGE} gate wait --url .*{EXPLAINED}")
GATES = re.compile(rf"^{PACKAGE} gate gates ")
FAIL_HOST = re.compile(r">&2; exit 1$")  # sparkrig's fail_host: a real shell exits 1 here
PRUNE = re.compile(r"^docker image rm \S+ >/dev/null \|\| echo 'kept ")
# sparkrig/rollback.py, release.py, revisiondirs.py: keep the serving release's files, put them
# back, record, adopt, prune
KEEP = re.compile(r"^sh -c 'set -e\nsha\(\) \{.*\nif sha ", re.S)
RESTORE = re.compile(r"^sh -c 'set -e\nsha\(\) \{.*cannot roll back", re.S)
ADOPT = re.compile(r"^sh -c 'set -e\nold=")
PRUNE_WEIGHTS = re.compile(rf"^rm -rf {OURS}/(model|drafter)-[0-9a-f]{{40}} ")
ROLLBACK_GATES = re.compile(rf"^{PACKAGE} gate gates ")
APT_MARK = re.compile(r"^apt-mark (hold|unhold)( [a-z0-9][a-z0-9.+-]*)+$")  # sparkrig/baseline.py
UPDATE_GRUB = re.compile(r"^update-grub$")


STACK_FILE_FETCH = re.compile(r"^/usr/bin/python3 -c '\nimport hashlib, os, sys, urllib")
PULLED_IMAGES = "/etc/sparkrig/pulled-images"  # the head's record of the bases it pulled


def stat_of(path: str) -> re.Pattern[str]:
    """pyinfra's File/Directory fact (uninstall.py uses the built-in files operations)."""
    return re.compile(rf"^! \(test -e {re.escape(path)} \|\| test -L ")


def owned_of(path: str) -> re.Pattern[str]:
    """The fakes' answer for one owned path (harness.batched asks it per path of OwnedPaths)."""
    return re.compile(rf"^p={re.escape(path)}; if \[ -L ")


def contents_of(path: str) -> re.Pattern[str]:
    """pyinfra's FileContents (read only under --diff, for a differing owned file)."""
    return re.compile(rf"^\( test -e {re.escape(path)} && cat {re.escape(path)} \)")


def unit_fact(unit: str, prop: str) -> re.Pattern[str]:
    return re.compile(rf"systemctl show --all --property Id --property {prop} {unit}\.service \)")


DOCKER_ACTION = re.compile(r"^systemctl (start|enable) docker\.(service|socket)$")


def docker_units(running: bool) -> dict[Any, Any]:
    """docker.service and docker.socket, enabled, running (socket: listening) or stopped (as
    ``systemctl stop docker.socket docker`` leaves them)."""
    table: dict[Any, Any] = {}
    for unit, up in (("docker.service", "running"), ("docker.socket", "listening")):
        shown = f"systemctl show --all --property Id --property {{}} {re.escape(unit)} \\)"
        table[re.compile(shown.format("SubState"))] = [
            f"Id={unit}",
            f"SubState={up if running else 'dead'}",
        ]
        table[re.compile(shown.format("UnitFileState"))] = [f"Id={unit}", "UnitFileState=enabled"]
    return table


ROCE_RESTORE = re.compile(r"^modprobe mlx5_ib$")  # group_data's roce_device_restore
ROCE_WAIT = re.compile(r"^timeout 60 sh -c 'until grep -qsxF ")
UNPAUSE = re.compile(r"^docker unpause sparkrig-rank\d+$")
PEER_DOWN_MARK = re.compile(r"^mkdir -p /run/sparkrig && echo .* > /run/sparkrig/pair-down$")
LINK_UP = re.compile(r"^ip link set dev \S+ up$")
CLOCK = re.compile(r"^date \+%s\.%N$")  # answered "<skew s>" (tests/plan/harness.py clock_now)
ADDR_DEL = re.compile(r"^if ip -o -4 addr show dev \S+ .*then ip -4 addr del ")
CARRIER_WAIT = re.compile(r"^i=0; until \[ \"\$\(cat /sys/class/net/\S+/carrier ")


def rank_runtime(
    container: str = "", handed: int | None = None, device_index: int | None = None,
    live_device_index: int | None = None, per_device: str = "", device_indexes: str = "",
    live_device_indexes: str = "",
) -> list[str]:  # fmt: skip
    """sparkrig.runningrank.RankRuntime's output: the container's docker state, the handed GID
    index and RDMA device index, that device's index now; fabric_layout "ports": every device's
    handed GID index and kernel index ("<dev>:<i>,..."), and each one's kernel index now."""
    said = [handed, device_index, live_device_index]
    handed_, device_, live_ = ("" if x is None else x for x in said)
    return [f"container={container}", f"handed={handed_}", f"device_index={device_}",
            f"live_device_index={live_}", f"handed_gids={per_device}",
            f"device_indexes={device_indexes}", f"live_device_indexes={live_device_indexes}",
            END]  # fmt: skip


def start_of(unit: str) -> str:
    """The deploy's command that starts the rank unit ``unit`` (sparkrig-head, sparkrig-worker)."""
    from sparkrig.owned import start_command

    return str(start_command(f"{unit}.service", journal=True).get_raw_value())


def bare(ip: str) -> dict[Any, Any]:
    """Every command the deploy may send to a node it never touched, answered as that node."""
    table: dict[Any, Any] = {
        # facts: nothing of sparkrig there yet; the fabric link is up at MTU 1500, no address
        NODE: node_report(),
        RANK_STATUS: rank_status(unit_ActiveState="inactive", unit_SubState="dead", mtu=1500),
        WHY: WHY_SAYS,
        PAIR_SECRET: held(""),  # no secret installed
        API_KEY: held(""),  # no API key installed
        API_KEY_ENV: [END],
        FRONT_CERT: [END],
        ENGINE_RUNTIME: [json.dumps(RUNTIME_SAYS)],
        SOAK: ["soak: 4 streams for 30 min", json.dumps(SOAK_HELD)],
        SECRET_WRITE: "",
        RELEASE: release_state(),  # no release record, weights_dir empty
        BASELINE: baseline_report(),  # DGX OS as shipped: nothing held, no KHO in the kernel
        GIDS: gid_table(HCA, "enp1s0f1np1", ip),  # the GID appears once the address is applied
        PORTS: [END],  # nothing listens on sparkrig's ports
        FRONT: ["nginx=missing", f"archive={ARCHIVE}", END],  # DGX OS ships no nginx
        FIREWALL: firewall_state(),  # nft installed (DGX OS, the lab), no sparkrig table
        FIREWALL_COUNTERS: ["table=absent"],
        REACH: reached(),  # the head reaches the Hub and the registry
        RANK_RUNTIME: rank_runtime(),  # no container, no start gate yet
        re.compile(rf"^p={OURS}; if \[ -L "): "",  # nothing sparkrig owns exists yet
        re.compile(rf"^! \(test -e {OURS} \|\| test -L "): "",
        PING_CHECK: "rc=1",
        WEIGHTS_STATE: '{"ok": false, "error": "fetcher or lockfile not installed"}',
        IMAGE_FACT: image_state(IMAGE, pulled=False, base=False, patched=False),
        contents_of(PULLED_IMAGES): [f"__pyinfra_missing_{PULLED_IMAGES}"],  # none pulled yet
        SAVED_TAR: [f"{'c' * 64} 123456", "sha256:" + "1" * 64 + ","],  # the head's saved tar
        GATES: HEALTHY_GATES,
        re.compile(r'^if \[ -n "\$TMPDIR" \]'): "/tmp",  # pyinfra's temp dir, for uploads
    }
    for unit in [*UNITS_KNOWN, "nginx"]:
        table[unit_fact(unit, "SubState")] = [f"Id={unit}.service", "SubState=dead"]
        table[unit_fact(unit, "UnitFileState")] = [f"Id={unit}.service", "UnitFileState="]
    table.update(docker_units(running=True))  # DGX OS runs docker from the first boot
    actions = [
        FAIL_HOST,
        rf"^(chown root:root|chmod [0-7]{{3}}|mkdir -p) {OURS}$",
        r"^mkdir -p /etc/systemd/system/[\w.-]+\.service\.d$",  # a drop-in's (sparkrig/owned.py)
        # uninstall.py: the drop-ins' directories left empty
        r'^for d in (/etc/systemd/system/[\w.-]+\.service\.d ?)+; do \[ ! -d "\$d" \] \|\| rmdir ',
        rf"^install -m 600 -o root -g root /dev/null {OURS}$",
        rf"^mv -f {OURS} {OURS}$",  # secret_installed: the 0600 temp file renamed over the secret
        rf"^rm -f {OURS}$",
        rf"^rm -rf {OURS}$",  # uninstall.py removes sparkrig's directories
        r"^systemctl (start|stop|enable|disable|restart|reload) sparkrig-[\w-]+(\.service)?$",
        # a rank's start, which prints its journal when it fails (start_of)
        r"^systemctl start (sparkrig-[\w-]+\.service) \|\| \{ journalctl -u \1 ",
        r"^systemctl daemon-reload$",
        r"^systemctl reset-failed 'sparkrig-\*'$",  # uninstall.py: removed units' failed state
        DOCKER_ACTION,
        SYSCTL, NETPLAN_GENERATE, NM_RELOAD, NM_UP, DISPLACE, PING,
        FETCH, WEIGHTS_SERVE, REHASH,
        r"^sh -c 'docker (pull --quiet|tag) ",  # the head's pull
        STACK_FILE_FETCH,  # the head fetches a stack's file (sparkrig/stackfiles.py)
        r"^sh -c 'set -e\nmkdir -p -m 700 /var/lib/sparkrig/images\n",  # save / load
        r"^sh -c 'systemctl stop sparkrig-image-serve 2>/dev/null; ",  # serve / unserve
        r"^rm -rf /opt/sparkrig/image-build && mkdir -p -m 700 /opt/sparkrig/image-build$",
        r"^sh -c 'set -e\ndocker image inspect \S+ >/dev/null 2>&1 \|\| ",  # build
        UNPAUSE, ROCE_RESTORE, ROCE_WAIT, PEER_DOWN_MARK, LINK_UP, ADDR_DEL, CARRIER_WAIT,
        SMOKE_CLEAN, SMOKE_WORKER, SMOKE_HEAD, SMOKE_CHECK,
        PAIR_WAIT, PAIR_REQUEST, BOOT_WAIT, PRUNE, ROUTES_REPAIR,
        KEEP, RESTORE, ADOPT, PRUNE_WEIGHTS,
        APT_MARK, UPDATE_GRUB,
        FRONT_INSTALL, FRONT_CHECK, FRONT_UNIT, FRONT_OFF, FRONT_ASIDE, FRONT_DRAIN,
        r"^sysctl -p /etc/sysctl\.d/91-sparkrig-fabric\.conf$",  # a relaying ring's forwarding
        r"^/usr/sbin/nft -c -f /etc/sparkrig/firewall\.nft$",  # checked before it is loaded
        r"^if /usr/sbin/nft list table inet sparkrig ",  # the table deleted (firewall off)
        r"^if nft list table inet sparkrig ",  # uninstall.py: a table left without its unit
        r"^\{ DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nftables ",
    ]  # fmt: skip
    for action in actions:
        matcher = action if isinstance(action, re.Pattern) else re.compile(action)
        table.setdefault(matcher, FAILED if action is FAIL_HOST else "")
    return table


def inject(short: str, responses: dict[Any, Any]) -> None:
    """Put ``responses`` ahead of what the test set for ``short`` so far (first match wins)."""
    rest = {k: v for k, v in STATE.get(short, {}).items() if k not in responses}
    STATE[short] = {**responses, **rest}


def host(
    name: str,
    ip: str,
    prefix: int = 24,
    responses: dict[Any, Any] | None = None,
    **data: Any,
) -> tuple[str, dict[str, Any]]:
    canned: dict[Any, Any] = dict(responses or {})
    for matcher, answer in bare(ip).items():
        canned.setdefault(matcher, answer)
    return (
        f"@fake/{name}",
        {
            "fabric_interface": "enp1s0f1np1",
            "fabric_address": f"{ip}/{prefix}",
            # these fakes answer one netdev's facts; a pair on both functions: rings/pairfakes.py
            "fabric_layout": "single",
            "fake_responses": canned,
            "fake_delay": 0,
            "fake_delay_jitter": 0,
            "base_image": IMAGE,
            "lockfile_dir": "tests/plan/locks",
            "pair_token_file": "tests/plan/pair-token",
            "api_key_file": "tests/plan/api-key",
            "api_tls_dir": TLS_DIR,
            **data,
        },
    )


# ---------------------------------------------------------------------------------------------
# A converged node, rendered (never copied from a run)
# ---------------------------------------------------------------------------------------------


@functools.cache
def settings_of(inventory: str) -> dict[str, Settings]:
    """The Settings the deploy builds for each host of an inventory file (group data included)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from sparkrig.config.inventory import build, view_of

    with ctx_state.use(State()):  # the CLI loads inventories inside a state
        return build(view_of(make_inventory(inventory, cwd=str(ROOT))))


def first_device(s: Settings) -> str:
    """The RDMA device the env file names first: the fabric NIC's, or the plan's first."""
    return s.fabric_rank.rdma_devices[0] if s.fabric_rank is not None else HCA


def owned_files(s: Settings, gid_index: int = 3) -> dict[str, tuple[bytes, str]]:
    """path -> (content, mode) of every file the deploy owns on this rank, made by the same
    functions the tasks call (render + the context builders, the programs, the lockfiles)."""
    from sparkrig import endpoint
    from sparkrig.fabric import env_context, env_template, netplan_text
    from sparkrig.front import (
        api_key_file,
        front_paths,
        key_include_text,
        restart_dropin_text,
        site_text,
    )
    from sparkrig.fronttls import TlsFiles, decide, tls_names, uses_pair_ca
    from sparkrig.helperunits import (
        agent_unit_context,
        pair_unit_context,
        restart_args,
        supervisor_unit_context,
        watchdog_unit_context,
    )
    from sparkrig.image import serving_image
    from sparkrig.pairsecret import control_token
    from sparkrig.paths import paths
    from sparkrig.render import base_context, render
    from sparkrig.serving import api_key_env, rank_unit_context, weights_id
    from sparkrig.weights import artifacts

    k, p = s.knobs, paths(s)
    text: dict[str, tuple[str, str]] = {
        "/etc/sysctl.d/90-sparkrig.conf": (
            render("sysctl.conf.j2", swappiness=k.swappiness, min_free_kbytes=k.min_free_kbytes),
            "644",
        ),
        k.fabric_netplan_file: (netplan_text(s), "600"),
        p.env_file: (
            render(
                env_template(s), **env_context(s), hca=first_device(s), gid_index=str(gid_index)
            ),
            "644",
        ),
        p.rank_unit: (
            render(
                "sparkrig-rank.service.j2", **rank_unit_context(s, serving_image(s), weights_id(s))
            ),
            "644",
        ),
        p.pair_unit: (render("sparkrig-pair.service.j2", **pair_unit_context(s)), "644"),
        p.pair_token: (control_token(s.pair_token_control) + "\n", "600"),
    }
    for art in artifacts(s):
        text[art.remote_lock] = (art.lock_text, "644")
    # no Hub token: the head holds it only while a gated repo is fetched (tasks/weights.py)
    if api_key_file(s):
        text[p.api_key] = (control_token(k.api_key_file) + "\n", "600")
        text[p.api_key_env] = (api_key_env(control_token(k.api_key_file)), "600")
    if s.me.is_head:
        front = front_paths(s)
        text[front["site"]] = (site_text(s), "644")
        text[front["restart_dropin"]] = (restart_dropin_text(), "644")
        if endpoint.balanced(s):  # behind one endpoint: in the balance
            text[endpoint.drain_include(s)] = (endpoint.drain_text(False), "644")
        if k.api_auth:
            text[front["key_include"]] = (key_include_text(control_token(k.api_key_file)), "600")
        if uses_pair_ca(s):  # the pair's CA, made by the first plan of the session
            files = TlsFiles(Path(k.api_tls_dir), s.pair)  # a named pair's: front-<pair>.*
            tls = decide(files, tls_names(s), s.me.name, False, False)
            text[front["tls_cert"]] = (tls.cert, "644")
            text[front["tls_key"]] = (tls.key, "600")
            text[front["tls_ca"]] = (tls.ca_cert, "644")
        text[p.restart_script] = (
            render("sparkrig-restart-pair.j2", **base_context(s), restart_args=restart_args(s)),
            "755",
        )
        text[p.supervisor_unit] = (
            render("sparkrig-supervisor.service.j2", **supervisor_unit_context(s)),
            "644",
        )
        if k.watchdog:
            text[p.watchdog_unit] = (
                render("sparkrig-watchdog.service.j2", **watchdog_unit_context(s)),
                "644",
            )
    else:
        text[p.agent_unit] = (
            render("sparkrig-agent.service.j2", **agent_unit_context(s)),
            "644",
        )
    if k.firewall:
        from sparkrig import firewall

        text[firewall.ruleset_path(s)] = (firewall.ruleset(s), "644")
        text[firewall.UNIT_FILE] = (firewall.unit(s), "644")
        for dropin in firewall.requires_dropins(s):
            text[dropin] = (firewall.requires_text(), "644")
    if k.gpu_clock_max_mhz is not None:
        text[p.gpu_clock_unit] = (
            render("sparkrig-gpu-clock.service.j2", unit=s.unit_name, mhz=k.gpu_clock_max_mhz),
            "644",
        )
    # a ring: forwarding, the relay unit and the NCCL graph files where the plan has them
    from sparkrig.fabric import (
        FORWARDING_FILE,
        RELAY_UNIT_FILE,
        forwarding_text,
        graph_texts,
        relay_unit_text,
    )

    if (sysctl := forwarding_text(s)) is not None:
        text[FORWARDING_FILE] = (sysctl, "644")
    if (relay := relay_unit_text(s)) is not None:
        text[RELAY_UNIT_FILE] = (relay, "644")
    text.update({path: (body, "644") for path, body in graph_texts(s).items()})
    files = {path: (body.encode(), mode) for path, (body, mode) in text.items()}
    package = hostpkg.remote_dir(k.install_dir)
    for module in hostpkg.modules():
        files[f"{package}/{module}"] = (hostpkg.source(module).read_bytes(), "644")
    return files


def running_units(s: Settings) -> list[str]:
    units = [s.unit_name, "sparkrig-pair"]
    if s.knobs.gpu_clock_max_mhz is not None:
        units.append("sparkrig-gpu-clock")
    if s.knobs.firewall:
        units.append("sparkrig-firewall")
    plan = s.fabric_plan
    if plan is not None and plan.relays:
        units.append("sparkrig-relay")
    if not s.me.is_head:
        units.append("sparkrig-agent")
    else:
        units.append("sparkrig-supervisor")
        if s.knobs.watchdog:
            units.append("sparkrig-watchdog")
        units.append("nginx")  # the API front
    return units


MODES = {"644": "-rw-r--r--", "600": "-rw-------", "755": "-rwxr-xr-x"}


def converged(
    s: Settings,
    *,
    gid_index: int = 3,
    env_gid_index: int = 3,
    mtu: int = 9000,
    files: dict[str, tuple[bytes, str]] | None = None,
    container: str = "running",
    handed_gid_index: int | None = None,
    device_index: int = 4,
    live_device_index: int = 4,
    admin_up: bool = True,
    rank_down: bool = False,
    ipv4_before: tuple[str, ...] = (),
) -> dict[Any, Any]:
    """Canned facts of a rank the deploy converged: every owned file with the rendered content
    (``files`` overrides some, e.g. an older unit), its units running, the fabric up at ``mtu``,
    the weights verified, the images built, the gates passing. ``gid_index``: where the GID
    table lists the fabric address now; ``env_gid_index``: what the rank's env file says;
    ``container``: its container's docker state; ``handed_gid_index``: the index its start gate
    handed over (default: the live one, as after any start); ``device_index`` and
    ``live_device_index``: the RDMA device's kernel index handed over and now;
    ``ipv4_before``: addresses the fabric NIC holds before the plan's (``ip -o -4 addr`` order)."""
    from sparkrig.front import front_paths
    from sparkrig.image import serving_image
    from sparkrig.paths import paths
    from sparkrig.weights import artifacts

    k = s.knobs
    owned = owned_files(s, env_gid_index) | (files or {})
    canned: dict[Any, Any] = {}
    for path, (data, mode) in owned.items():
        canned[owned_of(path)] = f"file {mode} root root {hashlib.sha256(data).hexdigest()}"
        canned[stat_of(path)] = (
            f"user=root group=root mode={MODES[mode]} atime=0 mtime=0 ctime=0 "
            f"size={len(data)} '{path}'"
        )
        canned[contents_of(path)] = data.decode().splitlines()
    dirs = [k.install_dir, paths(s).bin_dir, k.config_dir, k.weights_dir, k.cache_dir]
    for path in [*dirs, *hostpkg.remote_dirs(k.install_dir)]:
        canned[owned_of(path)] = "dir 755 root root"
        canned[stat_of(path)] = (
            f"user=root group=root mode=drwxr-xr-x atime=0 mtime=0 ctime=0 size=4096 '{path}'"
        )
    for unit in running_units(s):
        oneshot = unit in ("sparkrig-gpu-clock", "sparkrig-firewall", "sparkrig-relay")
        sub = "exited" if oneshot else "running"  # a oneshot that stays
        sub = "dead" if rank_down and unit == s.unit_name else sub
        canned[unit_fact(unit, "SubState")] = [f"Id={unit}.service", f"SubState={sub}"]
        canned[unit_fact(unit, "UnitFileState")] = [f"Id={unit}.service", "UnitFileState=enabled"]
    ip = s.me.ip
    canned[GIDS] = gid_table(HCA, s.me.fabric_interface, ip, index=gid_index)
    handed = gid_index if handed_gid_index is None else handed_gid_index
    canned[RANK_RUNTIME] = rank_runtime(container, handed, device_index, live_device_index)
    secret = owned[paths(s).pair_token][0].decode().strip()
    canned[PAIR_SECRET] = held(secret)
    key = owned.get(paths(s).api_key, (b"", ""))[0].decode().strip()
    canned[API_KEY] = held(key)
    env = owned.get(paths(s).api_key_env, (b"", ""))[0].decode()
    canned[API_KEY_ENV] = [hashlib.sha256(env.encode()).hexdigest(), "1", END] if env else [END]
    cert = owned.get(front_paths(s)["tls_cert"], (b"", ""))[0]
    canned[FRONT_CERT] = [hashlib.sha256(cert).hexdigest(), "1", END] if cert else [END]
    canned[re.compile(r"^cat /etc/sparkrig/pair-token$")] = [secret]  # apply-time reads
    canned[re.compile(r"^cat /etc/sparkrig/api-key$")] = [key]
    canned[NODE] = node_report(
        mtu=mtu,
        ipv4=",".join([*ipv4_before, s.me.fabric_address.with_prefixlen]),
        swappiness=k.swappiness,
        min_free_kbytes=k.min_free_kbytes or 67584,
        admin_up=admin_up,
        carrier=int(admin_up),
    )
    canned[PING_CHECK] = "rc=0" if mtu == k.fabric_mtu else "rc=1"
    for art in artifacts(s):
        canned[re.compile(rf"state --lock {re.escape(art.remote_lock)} ")] = json.dumps(
            {
                "ok": True,
                "commit": art.commit,
                "total_files": art.total_files,
                "verified": art.total_files,
                "files_to_fetch": 0,
                "bytes_to_fetch": 0,
            }
        )
    canned.update(converged_image_state(IMAGE, pulled=s.me.is_head))
    canned[BASELINE] = baseline_report(held=True)
    canned[PORTS] = converged_listeners(s)
    canned[FRONT] = ["nginx=installed" if s.me.is_head else "nginx=missing", END]
    canned[FIREWALL] = firewall_state(loaded=s.knobs.firewall)
    canned[FIREWALL_COUNTERS] = firewall_listing(s) if s.knobs.firewall else ["table=absent"]
    canned[RELEASE] = converged_release(s, owned)
    canned[WHY] = WHY_SAYS
    canned[ENGINE_RUNTIME] = [json.dumps(RUNTIME_SAYS)]
    canned[SOAK] = ["soak: 4 streams for 30 min", json.dumps(SOAK_HELD)]
    canned[RANK_STATUS] = rank_status(
        unit_ActiveState="active",
        unit_SubState="running",
        unit_StateChangeTimestamp="Mon 2026-11-30 06:00:00 UTC",
        image=serving_image(s),
        gid_env=env_gid_index,
        gids=tuple(gid_table(HCA, s.me.fabric_interface, ip, index=gid_index)[:-1]),
        mtu=mtu,
        memfree_kb=3 * 1024 * 1024,
        weights_commit=s.model.revision,
        weights_verified=1796000000,
        baseline=canned[BASELINE],
        record="".join(canned[RELEASE][: canned[RELEASE].index(LISTING) - 1]),
    )
    return canned


def release_shas(s: Settings, owned: dict[str, tuple[bytes, str]]) -> dict[str, str]:
    from sparkrig.release import release_files

    return {p: hashlib.sha256(owned[p][0]).hexdigest() for p in release_files(s) if p in owned}


def converged_release(
    s: Settings,
    owned: dict[str, tuple[bytes, str]],
    older: tuple[Any, ...] = (),
    baseline: list[str] | None = None,
) -> list[str]:
    """A rank whose record holds the release it runs (its files' digests) and the baseline it
    passed the gates on (``baseline``: the Baseline fact's output, default ``baseline_report()``),
    then ``older`` releases; weights_dir holds every recorded release's revision directories."""
    from dataclasses import replace

    from sparkrig.baseline import parse_baseline
    from sparkrig.release import record_text, wanted
    from sparkrig.runtime import record_of

    fields = parse_baseline(baseline or baseline_report()).fields()
    loaded = tuple(sorted((record_of(RUNTIME_SAYS) or {}).items()))
    now = replace(
        wanted(s, release_shas(s, owned)), baseline=tuple(sorted(fields.items())), runtime=loaded
    )
    releases = (now, *older)
    dirs = sorted({f"dir {name}" for r in releases for name in r.weights})
    return release_state(record_text(releases), tuple(dirs))

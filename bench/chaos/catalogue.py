"""The faults the campaign draws from: an operator's bad day, one fault at a time.

Each fault is shell run as root on one guest (``apply``), with ``{placeholders}`` filled per guest
and per draw (``fill``); docker's own ``{{.Field}}`` templates pass through untouched. ``undo``
runs after the check, whatever its verdict: it removes what the fault left that the deploy does
not own (a VLAN, a fill file, a foreign netplan file), so the next fault starts from a whole pair.

A fault with ``refused`` set is one the deploy must refuse rather than heal: it is handled when
the run exits non-zero, its output names ``refused``, and no operation changed anything on any
host; then the fault is undone and the pair must be whole again (one more run allowed: the
operator's run after fixing the cause).

``restarts``: the sparkrig units the fault may restart on every node (a pair restart is the
deploy's answer to a changed unit, env file, image, weights or fabric: docs/design.md,
tasks/stop.py);
``restarts_on_target``: more units it may restart on the node it hit. Any other sparkrig unit
whose InvocationID changed is a defect ("restarted a unit the fault did not touch")."""

from __future__ import annotations

from dataclasses import dataclass

PAIR = ("sparkrig-head", "sparkrig-worker", "sparkrig-pair", "sparkrig-supervisor",
        "sparkrig-watchdog")  # fmt: skip
EVERYTHING = ("sparkrig-*",)  # a reboot restarts every unit of the node
FILL = "/var/lib/sparkrig/chaos-fill"  # the disk-full fault's file (where the weights live)
CX7 = "/etc/netplan/40-cx7.yaml"  # NVIDIA's playbook file, as the lab suite plants it
NM_PROFILE = "/etc/NetworkManager/system-connections/cx7-port1.nmconnection"

# modes: how the operator's command meets the fault
PLAIN = "plain"  # apply, then one run
REBOOT = "reboot"  # apply (a reboot), wait until the node answers SSH again, then one run
KILL_RUN = "kill-run"  # apply a fault that gives the run work, SIGKILL the run, run again
SSH_CUT = "ssh-cut"  # apply a fault that gives the run work, cut one node's SSH, run again
SELF_HEAL = "self-heal"  # apply, wait until the pair serves again by itself, then one run

# The weights file a draw hits: the lockfile's entries sorted by path, picked by the draw's frac.
PICK_WEIGHTS_FILE = (
    'f={weights}/$(python3 -c \'import json,sys; fs=sorted(e["path"] for e in '
    'json.load(open(sys.argv[1]))["files"] if e["size"]); '
    "print(fs[int(float(sys.argv[2])*len(fs))])' {lock} {frac})"
)

# One byte of that file, at frac of its size, XORed with 0xff in place.
FLIP_BYTE = PICK_WEIGHTS_FILE + (
    "; python3 -c 'import os,sys; p=sys.argv[1]; "
    "o=int(float(sys.argv[2])*max(os.path.getsize(p)-1,0)); fd=os.open(p,os.O_RDWR); "
    'b=os.pread(fd,1,o); os.pwrite(fd,bytes([b[0]^255]),o); print(p,o)\' "$f" {frac}'
)


@dataclass(frozen=True)
class Fault:
    kind: str
    covers: str  # the item of the catalogue (docs/chaos.md) it stands for
    summary: str
    target: str  # "head", "worker" or "any" (the draw picks)
    apply: str
    undo: str = ""
    mode: str = PLAIN
    refused: str = ""  # non-empty: the deploy must refuse, naming this
    restarts: tuple[str, ...] = ()
    restarts_on_target: tuple[str, ...] = ()
    params: tuple[str, ...] = ()  # what the draw picks: frac, work, kill_after_s, cut_*


CATALOGUE: tuple[Fault, ...] = (
    Fault("fabric-mtu-reset", "fabric MTU reset", "the fabric NIC's MTU back to 1500 (a firmware "
          "update)", "any", "ip link set dev {iface} mtu 1500", restarts=PAIR),
    Fault("gid-renumbered", "GID renumbered",
          "the RDMA device re-created with a VLAN's GIDs taking the low indices before the fabric "
          "address is back (what a firmware reset does to the table; MTU kept)", "any",
          "ip link del chaos77 2>/dev/null; ip -4 addr flush dev {iface}; "
          "rdma link delete {rdma}; rdma link add {rdma} type rxe netdev {iface}; "
          "ip link add link {iface} name chaos77 type vlan id 77; "
          "ip addr add 10.77.0.{idx}/24 dev chaos77; ip link set chaos77 up; sleep 3; "
          "ip addr add {address} dev {iface}; sleep 2; rdma link show {rdma}/1",
          undo="ip link del chaos77 2>/dev/null || true", restarts=PAIR),
    Fault("fabric-address-flushed", "fabric address flushed", "the fabric IPv4 address flushed",
          "any", "ip -4 addr flush dev {iface}", restarts=PAIR),
    Fault("rdma-device-removed", "RDMA device removed", "the RoCE device deleted", "any",
          "rdma link delete {rdma}",
          undo="rdma link show {rdma}/1 >/dev/null 2>&1 || systemctl restart lab-rxe",
          restarts=PAIR),
    Fault("swappiness-drift", "swappiness changed live and its file deleted",
          "vm.swappiness=60 live and the sysctl.d file deleted", "any",
          "sysctl -qw vm.swappiness=60 && rm -f /etc/sysctl.d/90-sparkrig.conf"),
    Fault("owned-unit-edited", "an owned file edited (unit)", "the rank unit edited by hand",
          "any", "sed -i 's/^TimeoutStopSec=.*/TimeoutStopSec=5/' "
          "/etc/systemd/system/{unit}.service && systemctl daemon-reload", restarts=PAIR),
    Fault("owned-env-edited", "an owned file edited (env)", "the rank env file edited by hand",
          "any", "sed -i 's/^NCCL_DEBUG=.*/NCCL_DEBUG=INFO/' /etc/sparkrig/rank.env",
          restarts=PAIR),
    Fault("owned-netplan-edited", "an owned file edited (netplan)",
          "the fabric netplan file edited by hand (MTU 1500 in the file, the live MTU kept)",
          "any", "sed -i 's/mtu: [0-9]*/mtu: 1500/' /etc/netplan/60-sparkrig-fabric.yaml",
          restarts=PAIR),
    Fault("owned-sysctl-edited", "an owned file edited (sysctl)",
          "the sysctl.d file edited by hand (the live value kept)", "any",
          "sed -i 's/^vm.swappiness = .*/vm.swappiness = 10/' /etc/sysctl.d/90-sparkrig.conf"),
    Fault("config-dir-removed", "/etc/sparkrig removed", "/etc/sparkrig deleted", "any",
          "rm -rf /etc/sparkrig", restarts=PAIR, restarts_on_target=("sparkrig-agent",)),
    Fault("weights-byte-flipped-worker", "a weights byte flipped on a worker",
          "one byte of a weights file flipped on a worker", "worker",
          FLIP_BYTE,
          restarts=PAIR, params=("frac",)),
    Fault("weights-byte-flipped-head", "a weights byte flipped on the head",
          "one byte of a weights file flipped on the head", "head",
          FLIP_BYTE,
          restarts=PAIR, params=("frac",)),
    Fault("stale-part", "a stale .part",
          "a weights file turned into the .part a killed download leaves (its first frac bytes)",
          "any", PICK_WEIGHTS_FILE + "; mv \"$f\" \"$f.part\" && "
          "truncate -s $(( $(stat -c %s \"$f.part\") * {permille} / 1000 )) \"$f.part\" && "
          "ls -l \"$f.part\"", restarts=PAIR, params=("frac",)),
    Fault("image-base-removed", "the base image removed",
          "the base image removed: the pinned ref and the local base tag (image.py local_base)",
          "any", "docker image rm {base_image} 2>/dev/null; "
          "for t in $(docker image ls --format '{{.Repository}}:{{.Tag}}' {patched_repo} "
          "| grep -e ':base-' -e ':transfer-'); do docker image rm $t; done; "
          "docker image ls {patched_repo}"),
    Fault("image-patched-removed", "the patched image removed",
          "the patched serving image's tags removed (the running container keeps its layers)",
          "any", "docker image ls --format '{{.Repository}}:{{.Tag}}' {patched_repo} "
          "| grep -v -e ':base-' -e ':transfer-' | xargs -r -n1 docker image rm -f; "
          "docker image ls {patched_repo}", restarts=PAIR),
    Fault("container-killed", "a rank's container killed", "the rank's container killed", "any",
          "docker kill {container}", restarts=PAIR),
    Fault("container-paused", "a container frozen (docker pause)", "the rank's container paused",
          "any", "docker pause {container}",
          undo="docker unpause {container} 2>/dev/null || true", restarts=PAIR),
    Fault("docker-stopped", "docker stopped", "docker and its socket stopped (what an apt "
          "upgrade of docker-ce does first)", "any", "systemctl stop docker.socket docker",
          restarts=PAIR),
    Fault("docker-restarted", "docker restarted", "docker restarted", "any",
          "systemctl restart docker", restarts=PAIR),
    Fault("node-rebooted", "one node rebooted", "one node rebooted", "any",
          "systemd-run --on-active=2 --timer-property=AccuracySec=100ms systemctl reboot",
          mode=REBOOT, restarts=PAIR, restarts_on_target=EVERYTHING),
    Fault("control-killed", "the control process SIGKILLed mid-run, then run again",
          "a run with work to do (the drawn work fault) SIGKILLed after kill_after_s, then one "
          "run again", "any", "", mode=KILL_RUN, restarts=PAIR,
          restarts_on_target=("sparkrig-agent",), params=("work", "frac", "kill_after_s")),
    Fault("ssh-cut", "the SSH connection to one node cut mid-run, then run again",
          "a run with work to do (the drawn work fault); after cut_after_s the node's SSH "
          "sessions are killed and sshd is stopped for cut_for_s; then one run again", "any",
          # a script file: systemd-run (>= 254) would expand $s and $p in its arguments itself
          "printf '%s\\n' 's=$(systemctl is-active ssh.socket); "
          "systemctl stop ssh.socket ssh.service; "
          "for p in $(ss -Htnp state established \"( sport = :22 )\" | grep -o \"pid=[0-9]*\" "
          "| cut -d= -f2 | sort -u); do kill -9 $p; done; sleep {cut_for_s}; "
          "if [ \"$s\" = active ]; then systemctl start ssh.socket; "
          "else systemctl start ssh.service; fi' > /run/chaos-ssh-cut.sh; "
          "systemd-run --unit=chaos-ssh-cut --collect sh /run/chaos-ssh-cut.sh",
          undo="systemctl start ssh.service 2>/dev/null || systemctl start ssh.socket",
          mode=SSH_CUT, restarts=PAIR, restarts_on_target=("sparkrig-agent",),
          params=("work", "frac", "cut_after_s", "cut_for_s")),
    Fault("disk-full", "the disk where weights live filled to 100%",
          "a weights file deleted (the run has to fetch) and the weights' filesystem filled to "
          "100% (root's reserve too)", "any",
          PICK_WEIGHTS_FILE + "; rm -f \"$f\"; "
          "free=$(( $(stat -f -c '%f * %S' {weights}) )); "
          "fallocate -l $free " + FILL + " || fallocate -l $(( free - 16777216 )) " + FILL + "; "
          "dd if=/dev/zero of=" + FILL + ".tail bs=1M 2>/dev/null; sync; df -B1 {weights}",
          undo="rm -f " + FILL + " " + FILL + ".tail",
          refused="GiB free under", restarts=PAIR, params=("frac",)),
    Fault("fabric-claimed-netplan", "a foreign claim on the fabric NIC (a netplan file)",
          "another netplan file naming the fabric NIC (NVIDIA's playbook file)", "any",
          "printf 'network:\\n  version: 2\\n  ethernets:\\n    {iface}:\\n"
          "      addresses: [192.168.100.1{idx}/24]\\n      mtu: 9000\\n' > " + CX7 + "; "
          "chmod 600 " + CX7, undo="rm -f " + CX7,
          refused="is also configured by the netplan file " + CX7),
    Fault("fabric-claimed-nm", "a foreign claim on the fabric NIC (an NM profile)",
          "a hand-made NetworkManager profile naming the fabric NIC", "any",
          "printf '[connection]\\nid=cx7-port1\\ntype=ethernet\\ninterface-name={iface}\\n"
          "autoconnect=false\\n[ipv4]\\nmethod=manual\\naddress1=192.168.101.1{idx}/24\\n' > "
          + NM_PROFILE + "; chmod 600 " + NM_PROFILE + "; nmcli connection reload",
          undo="rm -f " + NM_PROFILE + "; nmcli connection reload",
          refused="is also claimed by the NetworkManager profile 'cx7-port1'"),
    # faults no one on the project wrote, tried by hand on the lab; appended, so the 25
    # kinds before them (seed 27's campaign) replay unchanged with --only of those kinds
    Fault("engine-sigstopped", "the head's engine process SIGSTOPped inside its container",
          "the engine's process (the container's main process, from the host's PID namespace) "
          "and its children stopped with SIGSTOP; the container still reads as running, so "
          "only the watchdog's canary sees it", "head",
          "p=$(docker inspect --format '{{.State.Pid}}' {container}); "
          "kill -STOP $p $(pgrep -P $p); echo stopped $p",
          undo="p=$(docker inspect --format '{{.State.Pid}}' {container} 2>/dev/null); "
          "[ -n \"$p\" ] && [ \"$p\" != 0 ] && kill -CONT $p $(pgrep -P $p) 2>/dev/null; true",
          mode=SELF_HEAL, restarts=PAIR),
    Fault("rank-unit-disabled", "a worker's rank unit disabled and stopped",
          "the worker's rank unit disabled and stopped by hand (systemctl disable --now)",
          "worker", "systemctl disable --now {unit}", restarts=PAIR),
    Fault("weights-file-deleted", "one worker weights file deleted outright",
          "one weights file deleted on a worker (restored from the head, sha256 verified)",
          "worker", PICK_WEIGHTS_FILE + "; rm -f \"$f\" && echo removed $f",
          restarts=PAIR, params=("frac",)),
    Fault("fabric-link-down", "the fabric netdev administratively down",
          "the fabric netdev set administratively down (ip link set down: what nmcli device "
          "disconnect or a driver reset can leave); brought up by one run, never a cable "
          "refusal", "any", "ip link set dev {iface} down", restarts=PAIR),
    Fault("host-package-removed", "the host package removed",
          "/opt/sparkrig removed; the run reinstalls it and reloads the stop-together watch (its "
          "beacon's socket kept). Without the package's state job the weights cannot be judged "
          "from their stamps, so the run verifies them again, which restarts the pair in order",
          "any", "rm -rf /opt/sparkrig", restarts=PAIR,
          restarts_on_target=("sparkrig-agent",)),
    # faults of the layers' interplay, healed once before the firewall and the front
    # existed or never tried; appended, so the kinds before them replay unchanged with --only
    Fault("fabric-extra-address", "a second address in front of the plan's on the fabric NIC",
          "the worker's fabric NIC's addresses flushed, another address of the fabric subnet "
          "(.222) added before the plan's and the RDMA device re-created (the kernel sources the "
          "rank's traffic from .222, which the head's firewall drops as not a peer); the run "
          "removes it by name", "worker",
          "a={address}; rdma link delete {rdma}; ip -4 addr flush dev {iface}; "
          "ip addr add ${a%.*}.222/${a#*/} dev {iface}; ip addr add {address} dev {iface}; "
          "rdma link add {rdma} type rxe netdev {iface}; sleep 2; ip -o -4 addr show dev {iface}",
          undo="a={address}; ip addr del ${a%.*}.222/${a#*/} dev {iface} 2>/dev/null; true",
          restarts=PAIR),
    Fault("clock-skew", "a rank's clock 120 s ahead",
          "one rank's clock set 120 s ahead (no NTP: the helpers' signed calls between the ranks "
          "would be refused as stale); preflight refuses it naming the skew and the fix", "any",
          "systemctl stop systemd-timesyncd 2>/dev/null; date -s @$(( $(date +%s) + 120 )); "
          "date", undo="date -s @$(( $(date +%s) - 120 )); date",
          refused="clocks: "),
    Fault("front-killed", "the API front killed", "the head's nginx SIGKILLed (the "
          "distribution's unit has Restart=no; sparkrig's drop-in brings it back)", "head",
          "systemctl kill -s KILL nginx.service; sleep 1; systemctl is-active nginx.service; true",
          mode=SELF_HEAL),
    Fault("api-key-deleted", "the head's API key file deleted and the ruleset flushed",
          "the head's API key file deleted and `nft flush ruleset` in the same sitting: the "
          "watchdog's canary cannot read the key (its own failure: no restart of a healthy "
          "pair); the run puts the key back and reloads the table", "head",
          "rm -f /etc/sparkrig/api-key; nft flush ruleset; echo deleted"),
)  # fmt: skip

BY_KIND = {f.kind: f for f in CATALOGUE}
# the first catalogue, the kinds before the five hand-tried ones: seed 27's campaign and CI's sample
# (seed 1234) draw from these (--only), so their sequences stay what they were
ISSUE27_KINDS = tuple(f.kind for f in CATALOGUE[: CATALOGUE.index(BY_KIND["engine-sigstopped"])])

# The faults that give a killed or cut run its work: each makes the run restart the pair, so the
# interruption can land anywhere from the state read to the head's boot wait.
WORK = ("owned-unit-edited", "config-dir-removed", "weights-byte-flipped-head", "fabric-mtu-reset")


def fill(command: str, values: dict[str, str]) -> str:
    """``command`` with each ``{key}`` of ``values`` replaced (and nothing else: docker's
    ``{{.Field}}`` templates stay as they are)."""
    for key, value in values.items():
        command = command.replace("{" + key + "}", value)
    return command

"""The TCP ports sparkrig listens on, per role, and who holds them now: a part of the state read
(``Listeners``, sparkrig/facts/ports.sh: one ``ss``, every holder's cgroup read by the shell)
that preflight judges. A port is fine when nothing listens on it or when sparkrig itself does (a
unit or container named ``sparkrig-*``, as on a converged pair); any other holder is refused,
named with its knob."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from sparkrig.config.model import Settings
from sparkrig.factlines import END, script_command
from sparkrig.stateread import Part, Values

OURS = "sparkrig-"  # every unit and container sparkrig runs is named so
FRONT_UNIT = "nginx.service"  # the API front holds api_port on the head (sparkrig/front.py)


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket on a port sparkrig needs, as ``ss -ltnp`` and /proc say."""

    port: int
    address: str  # the local address it listens on (0.0.0.0, [::], an interface's address)
    pid: int | None = None  # None: ss named no process (not root, another namespace)
    program: str = ""
    cgroup: str = ""  # its cgroup path: a systemd unit, a docker container's scope
    container: str = ""  # the docker container's name, when it runs in one

    @property
    def unit(self) -> str:
        """The systemd unit (service or scope) its cgroup names; "" when none."""
        last = self.cgroup.rstrip("/").rpartition("/")[2]
        return last if last.endswith((".service", ".scope")) else ""

    @property
    def sparkrigs(self) -> bool:
        """Held by sparkrig itself: one of its units or containers."""
        return self.unit.startswith(OURS) or self.container.startswith(OURS)

    def holder(self) -> str:
        """Who holds it, in words."""
        if self.pid is None:
            return "a process ss does not name"
        who = f"{self.program or 'a process'} (pid {self.pid}"
        if self.container:
            who += f", docker container {self.container}"
        elif self.unit:
            who += f", {self.unit}"
        return who + ")"


@dataclass(frozen=True)
class PortsReport:
    checked: bool = False  # False: ss is not installed, nothing is known
    listeners: tuple[Listener, ...] = ()


def parse_listeners(lines: list[str]) -> PortsReport:
    if END not in lines:
        raise FactProcessError("ports ended early (no end marker)")
    if "ss=missing" in lines:
        return PortsReport(checked=False)
    found = []
    for line in lines:
        if not line.startswith("listen="):
            continue
        local, pid, program, cgroup, container = (line[len("listen=") :].split("|") + [""] * 5)[:5]
        address, _, port = local.rpartition(":")
        if not port.isdigit():
            raise FactProcessError(f"ports: unexpected local address {local!r}")
        found.append(
            Listener(
                int(port), address, int(pid) if pid.isdigit() else None, program, cgroup, container
            )  # fmt: skip
        )
    return PortsReport(checked=True, listeners=tuple(found))


class Listeners(FactBase[PortsReport]):
    """
    Every listening TCP socket on ``ports``, with the process that holds it (``ss -ltnp``), its
    cgroup (its systemd unit or docker container) and the container's name.
    """

    default = PortsReport

    def command(self, ports: tuple[int, ...]) -> StringCommand:
        sport = " or ".join(f"sport = :{p}" for p in sorted(set(ports)))
        return script_command("ports", f"( {sport} )")

    def process(self, output: list[str]) -> PortsReport:
        return parse_listeners(output)


def needed_ports(s: Settings) -> dict[int, str]:
    """port -> its knob, for every port this rank listens on (the head: the API, the
    rendezvous, the copies it serves, the supervisor; a worker: its beacon and agent)."""
    k = s.knobs
    ports = {k.pair_port: "pair_port", k.agent_port: "agent_port"}
    if s.me.is_head:
        ports |= {
            k.api_port: "api_port",
            k.engine_port: "engine_port",
            k.master_port: "master_port",
            k.master_port + 1: "master_port (+1, the NCCL smoke test's rendezvous)",
            k.copy_port: "copy_port",
            k.image_copy_port: "image_copy_port",
        }
    return ports


def ports_part(s: Settings) -> Part:
    """The state read's part of the ports this rank needs."""
    return Part("ports", Listeners, (("ports", tuple(sorted(needed_ports(s)))),))


def ports_of(values: Values) -> PortsReport:
    return values.get("ports", Listeners)


def port_problems(s: Settings, report: PortsReport) -> list[str]:
    """A port this rank needs held by another program: refused, naming the port, its knob and
    the holder (one line per port)."""
    needed = needed_ports(s)
    out: dict[int, str] = {}
    for listener in report.listeners:
        knob = needed.get(listener.port)
        if knob is None or listener.sparkrigs or listener.port in out:
            continue
        if listener.port == s.knobs.api_port and listener.unit == FRONT_UNIT:
            continue  # the API front (nginx, sparkrig/front.py) serves api_port
        base = knob.partition(" ")[0]
        out[listener.port] = (
            f"port {listener.port} ({knob}) is held by {listener.holder()} on "
            f"{listener.address}:{listener.port}; stop that program, or set {base} to a port "
            f"free on every node"
        )
    return list(out.values())

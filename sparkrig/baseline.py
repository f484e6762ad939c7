"""The host baseline: what DGX OS runs under the pair (kernel and its command line, NVIDIA
driver, the fabric NIC's ConnectX-7 firmware, BIOS, docker and the NVIDIA container toolkit),
read as one part of the host's state read (sparkrig/stateread.py), recorded with the release
that passed the gates (sparkrig/release.py), compared between ranks and against a catalogue of
known-bad combinations (preflight), and held with ``apt-mark`` (tasks/baseline.py).

Every value comes from a file read by the shell itself, except two processes: one ``grep`` of
the running kernel's config (KHO) and one ``dpkg-query`` (package versions and holds).
docs/baseline.md says where each value comes from on a DGX Spark, with sources."""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.exceptions import FactProcessError

from sparkrig.config.checks import KnownBadBaseline
from sparkrig.config.model import Settings
from sparkrig.factlines import parse_key_values, script_command, script_inline
from sparkrig.owned import owned_of, owned_put
from sparkrig.render import render
from sparkrig.stateread import Part, Values, read_here

GRUB_DROPIN = "/etc/default/grub.d/90-sparkrig-kho.cfg"  # owned whole (kho_off)
GRUB_CFG = "/boot/grub/grub.cfg"  # what update-grub writes and GRUB boots from
# the fields the record keeps and drift is judged on; the ranks must agree on the first three
RECORDED = ("kernel", "cmdline", "driver", "nic_fw", "bios", "board", "docker", "toolkit")
MUST_MATCH = ("kernel", "driver", "nic_fw")

# "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (...)"
# (the open modules' format, with " for <arch>"; the proprietary ones omit "Open")
_PROC_DRIVER = re.compile(r"^NVRM version: .*Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)\s")
_VERSION = re.compile(r"^\d+(?:\.\d+)+$")
# 6.17.0-1032-nvidia, 7.0.0-1019-nvidia-64k (Ubuntu), 6.1.0-28-amd64, 6.12.48+deb13-amd64
_FLAVOUR = re.compile(r"^\d+\.\d+(?:\.\d+)?(?:[+~][^-]*)?(?:-\d+)?-(?P<flavour>[a-z][a-z0-9-]*)$")
_PRESENT = set("iUFHWt")  # dpkg's second status letter for a package that is (partly) installed


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    held: bool  # dpkg's selection is "hold" (apt-mark hold)


@dataclass(frozen=True)
class BaselineReport:
    kernel: str = ""
    cmdline: str = ""
    driver: str = ""  # "" when no NVIDIA module is loaded
    driver_open: bool = False  # the open kernel modules (/proc/driver/nvidia/version says Open)
    nic_fw: str = ""  # the fabric NIC's RDMA device's fw_ver; "" when it has none
    bios: str = ""  # "<vendor> <version> <date>"
    board: str = ""  # "<sys_vendor> <product_name>"
    kho_built: bool = False  # CONFIG_KEXEC_HANDOVER=y in /boot/config-<release>
    kho_default: bool = False  # CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y
    grub_kho: bool = False  # the generated GRUB menu boots with kho=off
    packages: tuple[Package, ...] = ()  # installed linux-*, *nvidia*, docker packages

    def version_of(self, *names: str) -> str:
        for p in self.packages:
            if p.name in names:
                return p.version
        return ""

    @property
    def docker(self) -> str:
        return self.version_of("docker-ce", "docker.io")

    @property
    def toolkit(self) -> str:
        return self.version_of("nvidia-container-toolkit")

    @property
    def kho_param(self) -> str:
        """The last ``kho=`` on the running command line ("" when none)."""
        values = [w.partition("=")[2] for w in self.cmdline.split() if w.startswith("kho=")]
        return values[-1].lower() if values else ""

    @property
    def kho_active(self) -> bool:
        """Kexec handover is on in the running kernel: built in, and enabled by default or by
        ``kho=on`` (kstrtobool's spellings), and not turned off by ``kho=off``."""
        if not self.kho_built:
            return False
        param = self.kho_param
        if param in ("on", "y", "yes", "1"):
            return True
        if param in ("off", "n", "no", "0"):
            return False
        return self.kho_default

    def fields(self) -> dict[str, str]:
        """What the release record keeps (RECORDED)."""
        return {name: str(getattr(self, name)) for name in RECORDED}


def parse_baseline(lines: list[str]) -> BaselineReport:
    """The baseline from its script's output; a line it cannot read fails the host."""
    raw = parse_key_values([x for x in lines if not x.startswith("pkg=")], "baseline")
    kernel = raw.get("kernel", "")
    if not kernel:
        raise FactProcessError("baseline: no kernel release (/proc/sys/kernel/osrelease)")
    driver, driver_open = raw.get("driver_module", ""), False
    proc = raw.get("driver_proc", "")
    if proc:
        m = _PROC_DRIVER.match(proc)
        if not m:
            raise FactProcessError(f"baseline: unreadable /proc/driver/nvidia/version: {proc!r}")
        driver = driver or m[1]
        driver_open = "Open Kernel Module" in proc
    if driver and not _VERSION.match(driver):
        raise FactProcessError(f"baseline: driver version {driver!r} is not a version")
    packages = []
    for line in lines:
        if not line.startswith("pkg="):
            continue
        fields = line[4:].split("|")
        if len(fields) != 3 or len(fields[0]) != 3 or not fields[1]:
            raise FactProcessError(f"baseline: unreadable package line {line!r}")
        abbrev, name, version = fields
        if abbrev[1] in _PRESENT:
            packages.append(Package(name, version, held=abbrev[0] == "h"))
    bios = " ".join(raw.get(f"dmi_bios_{k}", "") for k in ("vendor", "version", "date"))
    board = " ".join(raw.get(f"dmi_{k}", "") for k in ("sys_vendor", "product_name"))
    return BaselineReport(
        kernel=kernel,
        cmdline=raw.get("cmdline", ""),
        driver=driver,
        driver_open=driver_open,
        nic_fw=raw.get("nic_fw", ""),
        bios=" ".join(bios.split()),
        board=" ".join(board.split()),
        kho_built=raw.get("CONFIG_KEXEC_HANDOVER") == "y",
        kho_default=raw.get("CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT") == "y",
        grub_kho=raw.get("grub_kho") == "1",
        packages=tuple(sorted(packages, key=lambda p: p.name)),
    )


def script(fabric_interface: str, roce_device: str | None) -> str:
    """The baseline's shell script (sparkrig/facts/baseline.sh) as a piece of another read:
    status.py's one read, init's probe."""
    return script_inline("baseline", fabric_interface, roce_device or "", GRUB_CFG)


class Baseline(FactBase[BaselineReport]):
    """Kernel release and command line, NVIDIA driver, the fabric NIC's firmware, BIOS and
    board, KHO in the running kernel, and the kernel, NVIDIA and docker packages with holds."""

    default = BaselineReport

    def command(self, fabric_interface: str, roce_device: str = "") -> StringCommand:
        return script_command("baseline", fabric_interface, roce_device, GRUB_CFG)

    def process(self, output: list[str]) -> BaselineReport:
        return parse_baseline(output)


def baseline_part(s: Settings) -> Part:
    """The state read's part of the host baseline (sparkrig/hoststate.py parts_of)."""
    args = {"fabric_interface": s.me.fabric_interface, "roce_device": s.me.roce_device or ""}
    return Part("baseline", Baseline, tuple(sorted(args.items())))


def baseline_of(values: Values) -> BaselineReport:
    """The baseline part of a host's state read; KeyError when it was read without it."""
    return values.get("baseline", Baseline)


# ---------------------------------------------------------------------------------------------
# Verdicts (pure)
# ---------------------------------------------------------------------------------------------


def mismatch(everyone: dict[str, BaselineReport], order: Sequence[str]) -> str:
    """A table of every rank's kernel, driver and NIC firmware when they differ, else ''.
    ``order``: host names, rank order."""
    differ = [f for f in MUST_MATCH if len({getattr(everyone[n], f) for n in order}) > 1]
    if not differ:
        return ""
    rows: list[tuple[str, ...]] = [("rank", "host", *MUST_MATCH)]
    for rank, name in enumerate(order):
        b = everyone[name]
        rows.append((str(rank), name, *(getattr(b, f) or "-" for f in MUST_MATCH)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return (
        f"the ranks differ on {', '.join(differ)} (two ranks on different kernels, drivers or "
        "NIC firmware behave differently; bring them to one baseline, or set "
        "baseline_mismatch_ok = True to converge them anyway):\n    " + "\n    ".join(table)
    )


def _older(version: str, than: str) -> bool:
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v))

    return bool(version) and key(version) < key(than)


def matches(entry: KnownBadBaseline, b: BaselineReport, base_image: str) -> bool:
    """Every condition the entry names holds for this rank."""
    checks = [
        entry.kernel is None or re.search(entry.kernel, b.kernel) is not None,
        entry.driver is None or re.search(entry.driver, b.driver) is not None,
        entry.driver_below is None or _older(b.driver, entry.driver_below),
        entry.nic_fw is None or re.search(entry.nic_fw, b.nic_fw) is not None,
        entry.base_image is None or re.search(entry.base_image, base_image) is not None,
        entry.kho_active is None or entry.kho_active == b.kho_active,
    ]
    return all(checks)


def known_bad(s: Settings, b: BaselineReport) -> list[str]:
    """The catalogue's verdicts on this rank: its reason and source, each."""
    out = []
    for entry in s.knobs.known_bad_baselines:
        if matches(entry, b, s.image_ref):
            out.append(
                f"known-bad baseline (kernel {b.kernel}, driver {b.driver or 'none'}, NIC "
                f"firmware {b.nic_fw or 'none'}): {entry.reason} [{entry.source}] (set "
                "baseline_known_bad_ok = True to converge it anyway)"
            )
    return out


def drift(recorded: dict[str, str], now: BaselineReport) -> list[str]:
    """'<field> <recorded> -> <now>' for every recorded field that moved since the gates."""
    have = now.fields()
    return [
        f"{name} {recorded[name] or '-'} -> {have[name] or '-'}"
        for name in RECORDED
        if name in recorded and recorded[name] != have[name]
    ]


def describe(b: BaselineReport) -> str:
    driver = b.driver + (" (open)" if b.driver_open else "") if b.driver else "none"
    kho = "on" if b.kho_active else ("off" if b.kho_built else "not built")
    return (
        f"kernel {b.kernel} (KHO {kho}), driver {driver}, NIC firmware {b.nic_fw or 'none'}, "
        f"BIOS {b.bios or '-'}, docker {b.docker or '-'}, toolkit {b.toolkit or '-'}"
    )


def kernel_flavour(release: str) -> str:
    m = _FLAVOUR.match(release)
    return m["flavour"] if m else ""


def held_packages(b: BaselineReport) -> list[Package]:
    """The installed packages that make the running kernel and NVIDIA driver: every package
    named for the running release (image, modules, headers, tools, the driver's prebuilt
    modules), the flavour's metapackages (they pull the next kernel ABI in, under a new package
    name that a hold on the running image alone would not stop), and the driver branch's
    packages (``nvidia-*-580*``, ``libnvidia-*-580*``, ``linux-modules-nvidia-580*``)."""
    flavour = kernel_flavour(b.kernel)
    branch = b.driver.split(".", 1)[0] if b.driver else ""
    meta = (
        re.compile(
            rf"^linux-(?:(?:image|headers|modules|tools|signed-image)-)?{re.escape(flavour)}"
            r"(?:-hwe)?(?:-\d+\.\d+)?$"
        )
        if flavour
        else None
    )
    driver = re.compile(rf"^(?:lib)?nvidia-[a-z0-9.-]*?-{branch}(?:-|$)") if branch else None
    out = []
    for p in b.packages:
        if (
            (p.name.startswith("linux-") and p.name.endswith(b.kernel))
            or (meta is not None and meta.match(p.name))
            or (driver is not None and driver.match(p.name))
            or (branch and p.name.startswith(f"linux-modules-nvidia-{branch}"))
        ):
            out.append(p)
    return out


def grub_text() -> str:
    """The GRUB drop-in's content (templates/grub-kho.cfg.j2)."""
    return render("grub-kho.cfg.j2")


def wants_kho_off(s: Settings, b: BaselineReport) -> bool:
    return s.knobs.kho_off and b.kho_built


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


@operation()
def grub_kho_off(wanted: bool, path: str = GRUB_DROPIN) -> Generator[Any, None, None]:
    """
    Own the GRUB drop-in that boots the kernel with ``kho=off`` and regenerate the GRUB menu;
    effective at the next boot (sparkrig never reboots). Unwanted: remove the drop-in.

    + wanted: the running kernel has KHO built in and knob kho_off is on
    + path: the drop-in under /etc/default/grub.d (DGX OS's update-grub reads every *.cfg)
    """
    state = read_here("baseline", "paths")
    b, have = baseline_of(state), owned_of(state).file(path)
    if not wanted:
        if have is None:
            host.noop(f"no {path}: the kernel has no KHO or kho_off is off")
            return
        yield StringCommand("rm", "-f", QuoteString(path))
        yield StringCommand("update-grub")
        return
    commands = list(owned_put(grub_text().encode(), path, "644", "root", "root"))
    if commands or not b.grub_kho:
        yield from commands
        yield StringCommand("update-grub")
    else:
        host.noop(f"{path} is in place and {GRUB_CFG} boots with kho=off")
    if b.kho_param != "off":
        logger.warning(
            f"{host.print_prefix}kho=off is set for the next boot; the running kernel "
            f"({b.kernel}) still has it {'on' if b.kho_active else 'unset'} until you reboot "
            "(sparkrig never reboots)"
        )


@operation()
def baseline_held(names: list[str]) -> Generator[Any, None, None]:
    """
    Hold the running kernel and NVIDIA driver packages (``apt-mark hold``), so that a routine
    ``apt upgrade`` cannot move them.

    + names: the packages to hold (``held_packages``); empty: nothing to hold
    """
    b = baseline_of(read_here("baseline"))
    held = {p.name for p in b.packages if p.held}
    todo = [n for n in names if n not in held]
    if not todo:
        host.noop(f"{len(names)} baseline packages already held" if names else "nothing to hold")
        return
    yield StringCommand("apt-mark", "hold", *[QuoteString(n) for n in todo])


@operation()
def baseline_released(names: list[str]) -> Generator[Any, None, None]:
    """
    Release the hold on the baseline packages (``apt-mark unhold``) for a planned upgrade.

    + names: the packages that make the baseline (``held_packages``)
    """
    b = baseline_of(read_here("baseline"))
    held = {p.name for p in b.packages if p.held}
    todo = [n for n in names if n in held]
    if not todo:
        host.noop("no baseline package is held")
        return
    yield StringCommand("apt-mark", "unhold", *[QuoteString(n) for n in todo])

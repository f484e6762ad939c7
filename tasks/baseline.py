"""Phase 1c, baseline, before the host phase changes anything (so its operations decide from
the read made while preparing): hold the running kernel and NVIDIA driver packages with
``apt-mark`` so a routine ``apt upgrade`` cannot move them (``hold_baseline``;
``accept_baseline`` releases the hold for a planned upgrade), and boot a kernel with kexec
handover built in with ``kho=off`` through a GRUB drop-in, effective at the next reboot
(sparkrig never reboots). Preflight has already refused ranks that differ, or that match a
known-bad combination (sparkrig/baseline.py)."""

from pyinfra import host, logger

from sparkrig import hoststate
from sparkrig.baseline import (
    baseline_held,
    baseline_released,
    grub_kho_off,
    held_packages,
    wants_kho_off,
)
from sparkrig.config.inventory import current

settings = current()
knobs = settings.knobs
now = hoststate.read(settings).baseline

grub_kho_off(
    name="Boot with kho=off from the next reboot (GRUB drop-in, update-grub)",
    wanted=wants_kho_off(settings, now),
)
names = [p.name for p in held_packages(now)]
if knobs.accept_baseline:
    logger.warning(
        f"{host.print_prefix}accept_baseline: the kernel and driver packages are released for a "
        "planned upgrade; the next run that passes the gates records the new baseline"
    )
baseline_held(
    name="Hold the running kernel and NVIDIA driver packages (apt-mark hold)",
    names=names if knobs.hold_baseline and not knobs.accept_baseline else [],
)
baseline_released(
    name="Release the baseline packages for a planned upgrade (accept_baseline)",
    names=names if knobs.accept_baseline else [],
)

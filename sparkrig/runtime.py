"""The runtime as it loads: the NCCL library each rank's engine really mapped, the CUDA runtime
and driver it sees, the kernel's CMA pool (``sparkhost runtime``, files/sparkhost/runtime.py).

Two builds of one NCCL version are not the same library: pip's ``nvidia-nccl-cu13`` 2.28.9 and
DGX OS's ``libnccl2`` 2.28.9 have different build IDs, and a TP=2 pair of Sparks on the pip build
wedged after 20-26 minutes of 4-way load where the system build held a 60-minute soak
(``KNOWN_BAD``). An image's ``NCCL_VERSION`` can be stale, so nothing here trusts the image's
environment. After the head boots, every rank reads what its engine mapped (``runtime_recorded``);
the head then refuses a release whose ranks loaded different NCCL builds, or a build listed as
known bad (``runtime_agreed``), before it serves; a refused release rolls back like a failed
gate. The reading is kept with the release (sparkrig/release.py) and shown by status.py."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.api import operation
from pyinfra.context import ctx_state
from pyinfra.facts.server import Command

from sparkrig import hostpkg
from sparkrig.config.model import Settings
from sparkrig.factlines import last_json
from sparkrig.failing import fail_host
from sparkrig.runscope import once_per_run


@dataclass(frozen=True)
class KnownBad:
    """An NCCL build the field saw fail on Sparks, by version and build-ID prefix."""

    name: str
    version: str
    build_id: str  # a prefix of the ELF build ID, as the thread gives it
    why: str
    source: str

    def matches(self, lib: Mapping[str, Any]) -> bool:
        return lib.get("version") == self.version and str(lib.get("build_id", "")).startswith(
            self.build_id
        )


KNOWN_BAD = (
    KnownBad(
        name="pip's nvidia-nccl-cu13 2.28.9 (219 MB)",
        version="2.28.9",
        build_id="a7f420a1",
        why="a TP=2 pair of DGX Sparks wedged after 20-26 minutes of 4-way load on it; DGX OS's "
        "libnccl2 2.28.9 (Build ID c0db9360..., 190 MB) linked over it held a clean 60-minute "
        "soak, 420 of 420 requests",
        source="vllm-project/vllm#42354, vllm-project/vllm#41725, eugr/spark-vllm-docker#246 "
        "and PR #278",
    ),
)


def runtime_command(s: Settings) -> list[str]:
    """argv of the host job reading what this rank's engine loaded."""
    return hostpkg.command(s.knobs.install_dir, "runtime", "--container", s.container_name)


def parse_runtime(output: str) -> dict[str, Any]:
    """The job's JSON line; ``{"error": ...}`` when it printed none."""
    got = last_json(output)
    return (
        got
        if got is not None
        else {"error": output.strip()[-300:] or "no answer from sparkhost runtime"}
    )


def nccl_builds(reading: Mapping[str, Any]) -> list[str]:
    """Each NCCL the rank mapped, one line each (``2.28.9 build c0db9360 <path>``)."""
    out = []
    for lib in reading.get("nccl") or []:
        build = str(lib.get("build_id") or lib.get("sha256") or "?")[:8]
        out.append(f"{lib.get('version', '?')} build {build} {lib.get('path', '?')}")
    return out


def summary(reading: Mapping[str, Any]) -> str:
    """What status.py and the run's log print of a rank's reading."""
    if not reading:
        return "runtime -"
    if reading.get("error"):
        return f"runtime unread ({reading['error']})"
    nccl = "; ".join(nccl_builds(reading)) or "no NCCL loaded"
    cudart = ", ".join(str(c.get("version", "?")) for c in reading.get("cudart") or []) or "-"
    return f"nccl {nccl}; cudart {cudart}; driver {reading.get('driver') or '-'}"


def _identity(reading: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (str(lib.get("version", "")), str(lib.get("build_id") or lib.get("sha256", "")))
            for lib in reading.get("nccl") or []
        )
    )


def runtime_problems(readings: Mapping[str, Mapping[str, Any]], known_bad_ok: bool) -> list[str]:
    """Why a release may not serve on what its ranks loaded ([] when it may): a rank unread or
    with no NCCL, ranks on different NCCL builds, a known-bad build (unless ``known_bad_ok``)."""
    out = []
    for rank, reading in readings.items():
        if reading.get("error"):
            out.append(f"{rank}: what its engine loaded could not be read: {reading['error']}")
        elif not reading.get("nccl"):
            out.append(f"{rank}: its engine mapped no NCCL library (libnccl*) after the boot")
        for lib in reading.get("nccl") or []:
            for bad in KNOWN_BAD:
                if bad.matches(lib) and not known_bad_ok:
                    out.append(
                        f"{rank}: its engine loaded {bad.name}, a build listed as known bad: "
                        f"{lib.get('path')} (Build ID {lib.get('build_id')}): {bad.why} "
                        f"({bad.source}); use an image that loads another build (docs/"
                        "runtime.md), or nccl_known_bad_ok = True to serve on it anyway"
                    )
    builds = {rank: _identity(r) for rank, r in readings.items() if r.get("nccl")}
    if len(set(builds.values())) > 1:
        said = ", ".join(f"{rank} {'; '.join(nccl_builds(readings[rank]))}" for rank in builds)
        out.append(f"the ranks loaded different NCCL builds: {said}; every rank must run one")
    return out


def record_of(reading: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the release record keeps of a reading: the libraries and the driver, no figure that
    moves between runs (CMA's free pages), so a second run records nothing new. None: unread."""
    if not reading or reading.get("error"):
        return None
    return {
        "nccl": nccl_builds(reading),
        "cudart": sorted(str(c.get("path", "")) for c in reading.get("cudart") or []),
        "driver": str(reading.get("driver") or ""),
    }


def runtime_text(kept: Mapping[str, Any]) -> str:
    """A kept reading as status.py prints it: ``nccl 2.28.9 build c0db9360 /usr/lib/...``."""
    if not kept:
        return "nccl -"
    return "nccl " + ("; ".join(kept.get("nccl") or []) or "none loaded")


class Readings:
    """Each rank's reading in this run, filled as its ``runtime_recorded`` runs."""

    def __init__(self) -> None:
        self.by_rank: dict[str, dict[str, Any]] = {}

    def of(self, name: str) -> Callable[[], dict[str, Any] | None]:
        """What the release record calls when it runs: the rank's reading kept, or None."""
        return lambda: record_of(self.by_rank.get(name))


def readings() -> Readings:
    """The current run's readings (one object for every host and phase)."""
    return once_per_run("runtime-readings", ctx_state.get(), Readings)


@operation(is_idempotent=False)
def runtime_recorded(command: list[str]) -> Generator[Any, None, None]:
    """
    Read the NCCL, CUDA runtime and driver this rank's engine loaded (a reading changes nothing:
    always a no-op; the head judges every rank's next).

    + command: ``runtime_command``'s argv
    """
    if not host.state.is_executing:
        host.noop("the engine's runtime is read once it runs")
        return
    output = host.get_fact(Command, command=shlex.join(command) + " 2>&1 || true") or ""
    reading = parse_runtime(output)
    readings().by_rank[host.name] = reading
    logger.info(f"{host.print_prefix}{summary(reading)}")
    host.noop("read the engine's runtime")
    yield from ()


@operation(is_idempotent=False)
def runtime_agreed(ranks: list[str], known_bad_ok: bool) -> Generator[Any, None, None]:
    """
    Refuse a release whose ranks loaded different NCCL builds or a known-bad one (on the head,
    after every rank's ``runtime_recorded``).

    + ranks: the ranks of this run whose readings are judged
    + known_bad_ok: knob nccl_known_bad_ok (serve on a listed build anyway, warned)
    """
    if not host.state.is_executing:
        host.noop("the ranks' runtimes are judged once they run")
        return
    got = readings().by_rank
    judged = {rank: got.get(rank, {"error": "not read in this run"}) for rank in ranks}
    problems = runtime_problems(judged, known_bad_ok)
    if known_bad_ok:
        for rank, reading in judged.items():
            for lib in reading.get("nccl") or []:
                if any(bad.matches(lib) for bad in KNOWN_BAD):
                    logger.warning(f"{host.print_prefix}{rank}: serving on a known-bad NCCL "
                                   f"build ({lib.get('path')}): nccl_known_bad_ok")  # fmt: skip
    if not problems:
        host.noop("every rank loaded the same NCCL build, none listed as known bad")
        return
    for problem in problems:
        logger.error(f"{host.print_prefix}{problem}")
    yield fail_host("the release's runtime is refused:\n  " + "\n  ".join(problems))

"""``python3 <dir>/sparkhost JOB [ARGS]``: run one job of the host package.

Python puts the package directory itself first on ``sys.path`` when it runs a directory; it is
swapped for its parent so that only ``sparkhost.*`` resolves there (a module of the package
never shadows the standard library, e.g. ``token``)."""

from __future__ import annotations

import importlib
import os
import sys

JOBS = {  # job -> module that runs it (its main(argv) -> exit status)
    "fetch": "fetch",  # download and verify the weights of a lockfile
    "verify": "verify",  # check the files against the lockfile (quick or full)
    "state": "state",  # JSON of what is on disk, for the deploy's state read
    "serve": "serve",  # serve a directory read-only over HTTP (weights, the base image)
    "imageload": "imageload",  # check the head's base-image tar (size, sha256), then docker load
    "routes": "routes",  # per-uplink policy routing for the fetch lanes
    "follow": "follow",  # print a running fetch's progress until it ends
    "prep": "prep",  # the rank's start gate (fabric, GID, MemFree)
    "gate": "gate",  # the serving gates, the boot wait, the watchdog's probe
    "pair": "pair",  # stop-together, agent, supervisor, watchdog, ordered restart
    "why": "why",  # what explains a rank that did not start (firewall drops, addresses, ...)
    "nccl-smoke": "nccl_smoke",  # one all-reduce in the serving image (runs in the container)
    "soak": "soak",  # a new release held under concurrent load (the release's soak gate)
    "runtime": "runtime",  # the NCCL, CUDA runtime and driver the rank's engine loaded
}


def usage() -> str:
    return "usage: sparkhost JOB [ARGS]; jobs: " + ", ".join(JOBS)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in JOBS:
        print(usage(), file=sys.stderr)
        return 2
    module = importlib.import_module(f"sparkhost.{JOBS[argv[0]]}")
    rc: int = module.main(argv[1:])
    return rc


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.path.dirname(here))
    sys.exit(main(sys.argv[1:]))

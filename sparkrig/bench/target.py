"""The inventory's head as a bench target, read in a process of its own.

Loading a pyinfra inventory imports pyinfra's CLI, which gevent-patches threading and sockets for
the whole process; the bench's parallel streams and its clock must run on real threads, so
``python3 -m sparkrig.bench --inventory inventory.py`` asks this module, in a child process, for
the head's URL, model, profile and key file (sparkrig.config validates the inventory as the
deploy does), and measures from a clean process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def read(inventory: str, cwd: Path) -> dict[str, Any]:
    """The target of an inventory file (paths relative to ``cwd``, the repository root)."""
    proc = subprocess.run(
        [sys.executable, "-m", "sparkrig.bench.target", inventory],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["?"]
        raise SystemExit(f"bench: cannot read the inventory {inventory}: {last[0]}")
    target: dict[str, Any] = json.loads(proc.stdout)
    return target


def main(argv: list[str]) -> int:
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from sparkrig.config.api import api_target

    with ctx_state.use(State()):  # pyinfra's CLI loads inventories inside a state
        inventory = make_inventory(argv[0], cwd=".")
    print(json.dumps(api_target(inventory)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

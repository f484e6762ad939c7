"""``python3 -m sparkrig COMMAND [ARGS]``: the operator's commands beside the deploy.

init    an inventory from the boxes themselves: host keys pinned, fabric found (sparkrig/init.py)
check   every refusal that needs no host, offline (sparkrig/check.py)
logs    each rank's engine and helper journals (sparkrig/logs.py)
roll    a release through several pairs, one pair at a time, the others serving (sparkrig/roll.py)
"""

from __future__ import annotations

import sys

COMMANDS = {
    "init": "sparkrig.init",
    "check": "sparkrig.check",
    "logs": "sparkrig.logs",
    "roll": "sparkrig.roll",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    import importlib

    rc: int = importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

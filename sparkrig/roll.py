"""``python3 -m sparkrig roll [inventory.py] [--data KEY=VALUE ...] [--dry]``: a release change
(stack, revision, image, profile, sparkrig's patches) rolled through an inventory of several
pairs one pair at a time, the others serving meanwhile (docs/pairs.md).

For each pair in inventory order it runs the deploy on that pair alone (``pyinfra -y INVENTORY
deploy.py --limit <its hosts> --data ...``): the pair drains out of the endpoint's balance, is
upgraded, passes its gates and bench gate, and is put back, or is rolled back to the release it
served while the other pairs keep serving. The first pair that fails stops the roll: the pairs
after it are not touched and keep their release. It says which pair serves which release before
each step and after the last. Refusals that need no host (sparkrig check) stop it before any
host is reached."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkrig.check import refusals
from sparkrig.config.model import Settings


@dataclass(frozen=True)
class Pair:
    """One pair of the roll: its name and its hosts' inventory names, head first."""

    name: str
    hosts: tuple[str, ...]


def pairs_of(settings: dict[str, Settings]) -> list[Pair]:
    """The inventory's pairs in the order of their heads (an inventory of one cluster: one)."""
    first = next(iter(settings.values()))
    heads = first.pair_heads or (first.head,)
    out = []
    for head in heads:
        s = settings[head.name]
        out.append(Pair(s.pair or "the pair", tuple(r.name for r in s.ranks)))
    return out


def deploy_argv(inventory: str, pair: Pair, data: Sequence[str], dry: bool) -> list[str]:
    """The deploy of one pair: pyinfra's CLI as the operator runs it, limited to its hosts."""
    exe = shutil.which("pyinfra")
    argv = [exe] if exe else [sys.executable, "-m", "pyinfra"]
    argv += ["--dry", "--diff"] if dry else ["-y"]
    argv += [inventory, "deploy.py"]
    for name in pair.hosts:
        argv += ["--limit", name]
    for item in data:
        argv += ["--data", item]
    return argv


def where(pairs: Sequence[Pair], done: int, new: str, old: str) -> str:
    """Which pair serves which release once the first ``done`` pairs rolled."""
    return "; ".join(f"{p.name}: {new if i < done else old}" for i, p in enumerate(pairs))


def roll(
    inventory: str,
    data: Sequence[str],
    dry: bool = False,
    run: Callable[[list[str]], int] = lambda argv: subprocess.run(argv).returncode,
    say: Callable[[str], None] = print,
) -> int:
    """Roll the release through every pair in order; the deploy's exit status of the first pair
    that failed, else 0."""
    problems, settings = refusals(inventory, data)
    if problems:
        say(f"roll: {inventory} is refused before any host is reached:\n" + "\n".join(problems))
        return 1
    pairs = pairs_of(settings)
    new = "the new release" + (f" ({', '.join(data)})" if data else "")
    old = "the release it served"
    if len(pairs) == 1:
        say("roll: one pair: nothing serves while it restarts; this is the deploy itself")
    for i, pair in enumerate(pairs):
        rest = [p.name for p in pairs if p is not pair]
        say(f"roll: {i + 1}/{len(pairs)}: {pair.name} ({', '.join(pair.hosts)}) takes {new}; "
            f"{', '.join(rest) or 'no other pair'} serve meanwhile")  # fmt: skip
        rc = run(deploy_argv(inventory, pair, data, dry))
        if rc != 0:
            left = [p.name for p in pairs[i + 1 :]]
            say(
                f"roll: {pair.name} failed (exit {rc}): its deploy rolled it back to {old} where "
                f"it could (its output above says); "
                + (f"{', '.join(left)} not rolled, serving {old}. " if left else "")
                + f"Now: {where(pairs, i, new, old)}"
            )
            return rc
        say(f"roll: {pair.name} done. Now: {where(pairs, i + 1, new, old)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m sparkrig roll", description=__doc__.split("\n")[0]
    )
    ap.add_argument("inventory", nargs="?", default="inventory.py")
    ap.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                    help="as pyinfra's --data, passed to every pair's deploy")  # fmt: skip
    ap.add_argument("--dry", action="store_true", help="each pair's deploy with --dry --diff")
    args = ap.parse_args(argv)
    return roll(args.inventory, args.data, args.dry)

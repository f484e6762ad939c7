"""``python3 -m sparkrig check [inventory.py] [--data KEY=VALUE ...]``: every refusal that needs
no host, offline, in seconds: the inventory and group_data validated as the deploy validates them
(sparkrig/config/inventory.py ``for_inventory``: knobs, types, groups, fabric addresses, the stack
and its profile, the lockfiles and the Hub token) and each host's pinned SSH host key present,
``--data`` applied as pyinfra applies it. It
connects to nothing; exit 0 when nothing is refused, 1 with each refusal as a sentence."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from pyinfra.api.exceptions import DeployError

from sparkrig.config.inventory import for_inventory


def overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``--data KEY=VALUE`` as pyinfra's CLI reads it (pyinfra_cli.util.parse_cli_arg)."""
    from pyinfra_cli.util import parse_cli_arg

    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"check: --data wants KEY=VALUE, not {pair!r}")
        out[key] = parse_cli_arg(value)
    return out


def host_key_problems(inventory: Any) -> list[str]:
    """Each host whose pinned host key is missing: with ``ssh_known_hosts_file`` set (and strict
    checking, as sparkrig's inventories set it) the first SSH connection would be refused."""
    out = []
    for host in inventory:
        data = host.data.dict()
        known = data.get("ssh_known_hosts_file")
        if not known or host.name.startswith("@"):  # "@local", "@fake/...": not over SSH
            continue
        name = str(data.get("ssh_hostname") or host.name)
        port = int(data.get("ssh_port") or 22)
        entry = name if port == 22 else f"[{name}]:{port}"
        path = os.path.expanduser(str(known))
        found = (
            os.path.isfile(path)
            and subprocess.run(
                ["ssh-keygen", "-F", entry, "-f", path], capture_output=True
            ).returncode
            == 0
        )
        if not found:
            out.append(
                f"{host.name}: no host key for {entry} in {known} (ssh_known_hosts_file); pin it "
                f"once you trust it: `python3 -m sparkrig init` pins every box's, or `ssh-keyscan "
                f"-p {port} {name} >> {known}`; then compare its fingerprint with the box's own "
                "(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` at its console)"
            )
    return out


def refusals(inventory_file: str, data: Sequence[str], group_data: Sequence[str] = (),
             cwd: str = ".") -> tuple[list[str], dict[str, Any]]:  # fmt: skip
    """Every refusal of the inventory that needs no host (each a sentence), and its settings
    per host (empty when refused)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):  # pyinfra's CLI loads inventories inside a state
        inventory = make_inventory(inventory_file, cwd=cwd, override_data=overrides(data),
                                   group_data_directories=tuple(group_data) or None)  # fmt: skip
        problems = []
        settings: dict[str, Any] = {}
        try:
            settings = for_inventory(inventory)
        except DeployError as err:
            problems.append(str(err))
        problems += host_key_problems(inventory)
    return problems, settings


def refuse_before_connecting() -> None:
    """The deploy's first step (config.py, which pyinfra loads before it reads the inventory
    or connects): ``pyinfra INVENTORY deploy.py`` with a refusal that needs no host stops here,
    offline, each reason a sentence, exit 1. Any other command, or no pyinfra CLI, passes."""
    import click

    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx is not None else {}
    operations = [os.path.basename(str(o)) for o in params.get("operations") or ()]
    if operations != ["deploy.py"] or not params.get("inventory"):
        return
    inventory = str(params["inventory"])
    problems, _ = refusals(inventory, params.get("data") or (), params.get("group_data") or (),
                           cwd=str(params.get("chdir") or "."))  # fmt: skip
    if problems:
        click.echo(f"sparkrig: {inventory} is refused before any host is reached:", err=True)
        click.echo("\n".join(problems), err=True)
        raise SystemExit(1)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m sparkrig check", description=__doc__.split("\n")[0]
    )
    ap.add_argument("inventory", nargs="?", default="inventory.py")
    ap.add_argument("--data", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    problems, settings = refusals(args.inventory, args.data)
    if problems:
        print(f"check: {args.inventory} is refused:\n" + "\n".join(problems), file=sys.stderr)
        return 1
    s = next(iter(settings.values()))
    print(
        f"check: {args.inventory}: {ranks_text(settings)}, stack {s.knobs.stack}, profile "
        f"{s.knobs.profile}: nothing refused that needs no host (the deploy's preflight checks "
        "the hosts themselves)"
    )
    return 0


def ranks_text(settings: dict[str, Any]) -> str:
    """``2 ranks``, or for an inventory of several pairs ``4 ranks in 2 pairs (pair_a 2,
    pair_b 2)``."""
    pairs: dict[str, int] = {}
    for s in settings.values():
        pairs[s.pair] = pairs.get(s.pair, 0) + 1
    if list(pairs) == [""]:
        return f"{len(settings)} ranks"
    each = ", ".join(f"{name} {n}" for name, n in pairs.items())
    return f"{len(settings)} ranks in {len(pairs)} pairs ({each})"


if __name__ == "__main__":
    sys.exit(main())

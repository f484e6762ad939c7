"""The agents' shared secret lives with the pair, not with a control machine.

A fresh clone or a second operator's machine has no control-side copy; the deploy then takes the
secret the ranks already hold, so it never rotates behind the running agents. A new secret is made
only when no rank holds one (first deploy) or when the operator asks for it (``pair_token_rotate``).
Ranks holding different secrets are refused before anything changes. The decision needs the ranks'
installed files (a fact), so it is made in the tasks, once per run (``pair_secret``)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkrig.runscope import once_per_run
from sparkrig.settings import Settings


@dataclass(frozen=True)
class PairSecret:
    token: str  # what every rank of the run must hold; "" when refused
    source: str  # said in the run's log
    problem: str = ""  # non-empty: refuse before any change
    warning: str = ""


ROTATE_HOW = (
    "set pair_token_rotate = True for one run (e.g. --data pair_token_rotate=True) with every "
    "rank in it: one new secret on every rank, their agents, supervisor and watchdog restarted"
)


def control_token(path: str) -> str:
    """The control side's copy of the secret (stripped), "" when the file does not exist."""
    file = Path(path).expanduser()
    return file.read_text().strip() if file.exists() else ""


def new_token() -> str:
    return secrets.token_hex(24)


def decide(
    control: str,
    held: dict[str, str],
    missing_ranks: list[str],
    rotate: bool,
    control_file: str,
    make: Callable[[], str] = new_token,
) -> PairSecret:
    """Which secret the run installs.

    control: the control side's copy ("" none); held: rank name -> installed secret ("" none) of
    every rank in the run; missing_ranks: ranks not in the run; rotate: pair_token_rotate."""
    if rotate:
        if missing_ranks:
            return PairSecret(
                "",
                "",
                problem=f"pair_token_rotate needs every rank in the run; "
                f"{', '.join(missing_ranks)} not in it (run without --limit)",
            )
        return PairSecret(make(), "rotated on request (pair_token_rotate)")
    found = {name: token for name, token in held.items() if token}
    distinct = sorted(set(found.values()))
    if len(distinct) > 1:
        groups = sorted(
            "/".join(sorted(n for n, t in found.items() if t == token)) for token in distinct
        )
        return PairSecret(
            "",
            "",
            problem=f"the ranks hold different pair secrets ({' vs '.join(groups)}): their "
            f"agents refuse each other; {ROTATE_HOW}",
        )
    if distinct:
        holders = ", ".join(sorted(found))
        warning = ""
        if control and control != distinct[0]:
            warning = (
                f"{control_file} differs from the secret the pair holds ({holders}); the pair's "
                f"is kept and {control_file} ignored (delete it, or {ROTATE_HOW})"
            )
        return PairSecret(distinct[0], f"the one the pair holds ({holders})", warning=warning)
    if control:
        return PairSecret(control, f"no rank holds one: {control_file} installed")
    if missing_ranks:
        return PairSecret(
            "",
            "",
            problem=f"no rank in this run holds the pair secret, {control_file} does not exist, "
            f"and {', '.join(missing_ranks)} not in the run: a new secret made now would "
            "differ from theirs; run the deploy with every rank",
        )
    return PairSecret(make(), "no rank holds one: a new one made")


def pair_secret(s: Settings) -> PairSecret:
    """The run's decision, made once (every host of the run installs the same secret)."""
    from pyinfra import host
    from pyinfra.context import ctx_state

    from sparkrig import hoststate
    from sparkrig.settings import for_inventory

    state = ctx_state.get()

    def make_decision() -> PairSecret:
        inventory = host.inventory
        everyone = for_inventory(inventory)
        held: dict[str, str] = {}
        missing: list[str] = []
        for rank in s.ranks:
            other = inventory.get_host(rank.name)
            if state.is_host_in_limit(other):
                held[rank.name] = hoststate.read(everyone[rank.name]).pair_secret
            else:
                missing.append(rank.name)
        k = s.knobs
        return decide(
            control_token(k.pair_token_file), held, missing, k.pair_token_rotate, k.pair_token_file
        )

    return once_per_run("pair secret", state, make_decision)

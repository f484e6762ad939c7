"""Secrets that live with the pair, not with a control machine: the agents' shared secret and
the API key.

A fresh clone or a second operator's machine has no control-side copy; the deploy then takes the
one the ranks already hold, so it never rotates behind the running agents or the API's clients. A
new one is made only when no rank holds one (first deploy) or when the operator asks for it
(``pair_token_rotate``, ``api_key_rotate``). Ranks holding different secrets are refused before
anything changes. The decision needs the ranks' installed files (the state read), so it is made
in the tasks: the agents' secret once per pair of the run (``pair_secret``: each pair its own,
its control copy ``Settings.pair_token_control``), the API key once per run (``api_key``: one
key for the endpoint, every pair's head in the run holding it)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sparkhost.pairmac import MIN_SECRET
from sparkhost.tokenfile import read_secret

from sparkrig.config.inventory import for_inventory
from sparkrig.config.model import Settings
from sparkrig.paths import HostPaths, paths
from sparkrig.runscope import once_per_run, slot
from sparkrig.secretio import Held, SecretDigest, digest, read_secret_now, write_control_file
from sparkrig.stateread import Part, Values


def secret_parts(s: Settings) -> list[Part]:
    """The state read's parts of the secrets installed on ``s``'s host, by digest only
    (sparkrig/secretio.py): the agents' secret, and on the head the API key (it lives with the
    head)."""
    p = paths(s)
    parts = [Part("pair_secret", SecretDigest, (("path", p.pair_token),))]
    if s.me.is_head:
        parts.append(Part("api_key", SecretDigest, (("path", p.api_key),)))
        parts.append(Part("api_key_env", SecretDigest, (("path", p.api_key_env),)))
    return parts


@dataclass(frozen=True)
class Secret:
    token: str  # what every rank of the run must hold; "" when refused or held but not known here
    source: str  # said in the run's log
    problem: str = ""  # non-empty: refuse before any change
    warning: str = ""
    sha256: str = ""  # the installed file's digest every holder must have (token + newline)
    holder: str = ""  # when the token is not known here: a rank holding it (relayed at apply)

    @property
    def known(self) -> bool:
        """The value is on the control side (made, rotated, or its copy matches the pair's)."""
        return bool(self.token)


@dataclass(frozen=True)
class Kind:
    """What ``decide`` calls a secret and its holders in the run's messages."""

    name: str  # "pair secret"
    knob: str  # its rotation knob
    rotate_how: str  # how to rotate it, said in problems and warnings
    holders: str = "the pair"  # who holds it: "the pair's is kept"
    scope: str = "every rank"  # who must be in the run to rotate it
    none_held: str = "no rank holds one"
    stale_control: str = "ignored (delete it, or {how})"  # a differing control-side copy
    min_length: int = 0  # a shorter one held or seeded is refused (the pair secret signs)
    differ: str = "their agents refuse each other"  # what holders that differ break


ROTATE_HOW = (
    "set pair_token_rotate = True for one run (e.g. --data pair_token_rotate=True) with every "
    "rank in it: one new secret on every rank, their agents, supervisor and watchdog restarted"
)
PAIR = Kind("pair secret", "pair_token_rotate", ROTATE_HOW, min_length=MIN_SECRET)
API_ROTATE_HOW = (
    "set api_key_rotate = True for one run (e.g. --data api_key_rotate=True) with the head in "
    "it: a new key on the head, its serving restarted in order, the key written to api_key_file "
    "(every client needs the new one)"
)
API_KEY = Kind(
    "API key",
    "api_key_rotate",
    API_ROTATE_HOW,
    holders="the head",
    scope="the head",
    none_held="the head holds none",
    stale_control="overwritten with it: clients must use the head's key ({how} to change it)",
)
# the same, for an endpoint of several pairs: one key on every pair's head
API_HEADS_ROTATE_HOW = (
    "set api_key_rotate = True for one run (e.g. --data api_key_rotate=True) with every pair's "
    "head in it: one new key on every head, each pair's serving restarted in order, the key "
    "written to api_key_file (every client needs the new one)"
)
API_KEY_HEADS = replace(
    API_KEY,
    rotate_how=API_HEADS_ROTATE_HOW,
    holders="each head",
    scope="every pair's head",
    none_held="no head holds one",
    stale_control="overwritten with it: clients must use the heads' key ({how} to change it)",
    differ="a client's key would be refused by some of them",
)


def control_token(path: str) -> str:
    """The control side's copy of the secret (stripped), "" when the file does not exist."""
    if not Path(path).expanduser().exists():
        return ""
    return read_secret(path) or ""


def new_token() -> str:
    return secrets.token_hex(24)


def decide(
    control: str,
    held: dict[str, Held],
    missing_ranks: list[str],
    rotate: bool,
    control_file: str,
    make: Callable[[], str] = new_token,
    kind: Kind = PAIR,
) -> Secret:
    """Which secret the run installs.

    control: the control side's copy ("" none); held: rank name -> the digest of its installed
    secret (``Held()`` none) of every holder in the run; missing_ranks: holders not in the run;
    rotate: the rotation knob; kind: what the messages call it (``PAIR``, ``API_KEY``). The
    ranks' secrets are known by digest only: one the control side has no copy of is kept by
    digest (``token`` "", ``holder`` a rank that has it)."""
    how = kind.rotate_how

    def made(token: str, source: str, warning: str = "") -> Secret:
        return Secret(token, source, warning=warning, sha256=digest(token + "\n"))

    if rotate:
        if missing_ranks:
            return Secret(
                "",
                "",
                problem=f"{kind.knob} needs {kind.scope} in the run; "
                f"{', '.join(missing_ranks)} not in it (run without --limit)",
            )
        return made(make(), f"rotated on request ({kind.knob})")
    found = {name: h for name, h in held.items() if h}
    distinct = sorted({h.sha256 for h in found.values()})
    if len(distinct) > 1:
        groups = sorted(
            "/".join(sorted(n for n, h in found.items() if h.sha256 == sha)) for sha in distinct
        )
        return Secret(
            "",
            "",
            problem=f"the ranks hold different {kind.name}s ({' vs '.join(groups)}): "
            f"{kind.differ}; {how}",
        )
    if distinct:
        holders = ", ".join(sorted(found))
        first = sorted(found)[0]
        chars = found[first].chars
        if chars < kind.min_length:
            return Secret(
                "",
                "",
                problem=f"the {kind.name} {kind.holders} holds ({holders}) is "
                f"{chars} characters, shorter than the {kind.min_length} its helpers "
                f"need to start (a truncated file?); {how}",
            )
        warning = ""
        if control and Held.of(control).sha256 == distinct[0]:
            return made(control, f"the one {kind.holders} holds ({holders})")
        if control:
            stale = kind.stale_control.format(how=how)
            warning = (
                f"{control_file} differs from the {kind.name} {kind.holders} holds ({holders}); "
                f"{kind.holders}'s is kept and {control_file} {stale}"
            )
        return Secret(
            "",
            f"the one {kind.holders} holds ({holders})",
            warning=warning,
            sha256=distinct[0],
            holder=first,
        )
    if control:
        if len(control) < kind.min_length:
            return Secret(
                "",
                "",
                problem=f"{control_file} holds a {kind.name} of {len(control)} characters, "
                f"shorter than the {kind.min_length} its helpers need to start: delete it (a "
                f"new one is made) or write one of {kind.min_length} or more",
            )
        return made(control, f"{kind.none_held}: {control_file} installed")
    if missing_ranks:
        return Secret(
            "",
            "",
            problem=f"no rank in this run holds the {kind.name}, {control_file} does not exist, "
            f"and {', '.join(missing_ranks)} not in the run: a new one made now would "
            "differ from theirs; run the deploy with every rank",
        )
    return made(make(), f"{kind.none_held}: a new one made")


def pair_secret(s: Settings, read: Callable[[Settings], Values]) -> Secret:
    """The decision of ``s``'s pair, made once per pair of the run (every host of the pair
    installs the same secret, another pair its own, from its own control copy
    ``Settings.pair_token_control``); ``read`` gives a rank's state read
    (sparkrig/hoststate.py ``values``)."""
    from pyinfra import host
    from pyinfra.context import ctx_state

    state = ctx_state.get()

    def make_decision() -> Secret:
        inventory = host.inventory
        everyone = for_inventory(inventory)
        held: dict[str, Held] = {}
        missing: list[str] = []
        for rank in s.ranks:
            other = inventory.get_host(rank.name)
            if state.is_host_in_limit(other):
                held[rank.name] = read(everyone[rank.name]).get("pair_secret", SecretDigest)
            else:
                missing.append(rank.name)
        k, control_file = s.knobs, s.pair_token_control
        return decide(control_token(control_file), held, missing, k.pair_token_rotate, control_file)

    return once_per_run(slot("pair secret", s.pair), state, make_decision)


def api_key(s: Settings, read: Callable[[Settings], Values]) -> Secret | None:
    """The endpoint's one API key, decided once per run from the installed key of every pair's
    head in the run (their state reads: ``read``); None when nothing about the key is decided:
    the API is open (``api_auth = False``) or no head is in the run (``--limit worker``; rotating
    then is refused). Heads holding different keys are refused; a head lacking the key the
    others hold while the control side has no copy of it is refused (it cannot be written)."""
    from pyinfra import host
    from pyinfra.context import ctx_state

    state = ctx_state.get()

    def make_decision() -> Secret | None:
        inventory = host.inventory
        everyone = for_inventory(inventory)
        heads = [everyone[h.name] for h in s.pair_heads or (s.head,)]
        k = heads[0].knobs  # the heads': the key is theirs, the same on every one (rules.py)
        if not k.api_auth:
            return None
        kind = API_KEY if len(heads) == 1 else API_KEY_HEADS
        rotate = any(h.knobs.api_key_rotate for h in heads)
        control = control_token(k.api_key_file)
        in_run = [h for h in heads if state.is_host_in_limit(inventory.get_host(h.me.name))]
        missing = [h.me.name for h in heads if h.me.name not in {r.me.name for r in in_run}]
        if not in_run:
            if rotate:  # refused, never silently skipped
                return decide(control, {}, missing, True, k.api_key_file, kind=kind)
            return None
        values = {h.me.name: read(h) for h in in_run}
        held = {name: v.get("api_key", SecretDigest) for name, v in values.items()}
        got = decide(control, held, missing, rotate, k.api_key_file, kind=kind)
        if not got.sha256 or got.known:
            return got
        for head in in_run:  # the heads' key, known here by digest only: nothing is written
            name = head.me.name
            if held[name].sha256 != got.sha256:
                return replace(got, problem=lacks_key(head, got.holder, k.api_key_file))
            if not values[name].get("api_key_env", SecretDigest):
                return replace(got, problem=lost_env(paths(head), k.api_key_file))
        return got

    return once_per_run("api key", state, make_decision)


def lacks_key(head: Settings, holder: str, control_file: str) -> str:
    """Why a run refuses an endpoint whose head ``head`` holds no API key while another head
    holds one the control side has no copy of: the deploy never reads a secret back to write a
    file, so that head's key, env file and front include cannot be written."""
    p = paths(head)
    return (
        f"{head.me.name} holds no API key ({p.api_key}) and {control_file} holds no copy of the "
        f"one {holder} holds, so it cannot be written there: copy {holder}'s key to "
        f"{control_file} (on {holder}: sudo cat {p.api_key}) and run again, or "
        f"{API_HEADS_ROTATE_HOW}"
    )


def lost_env(p: HostPaths, control_file: str) -> str:
    """Why a run refuses a head that holds an API key but lost vLLM's env file, while the control
    side has no copy of that key: the deploy never reads a secret back to rebuild a file."""
    return (
        f"the head holds an API key ({p.api_key}) but its env file for vLLM "
        f"({p.api_key_env}) is gone, and {control_file} holds no copy of that key: copy the "
        f"head's key to {control_file} (on the head: sudo cat {p.api_key}) and run again, or "
        f"{API_ROTATE_HOW}"
    )


def write_control_copy(path: str, token: str) -> None:
    """Write ``token`` to the control side's ``path``, 0600 from the first byte, renamed over."""
    write_control_file(Path(path).expanduser(), (token + "\n").encode(), secret=True)


def write_control_copy_later(
    path: str, token: str, holder: str = "", remote: str = "", sha256: str = ""
) -> Callable[[], None]:
    """``write_control_copy`` for ``python.call``: runs when the run executes (never in --dry),
    says so in the log; the token stays in the closure (no operation argument shows it). With no
    ``token`` (the head holds one the control side lacks) it is read from ``holder``'s ``remote``
    path at that moment, unprinted, and must have ``sha256`` (sparkrig/secretio.py)."""

    def write() -> None:
        from pyinfra import host, logger
        from pyinfra.context import ctx_state

        value = token
        if not value:
            source = ctx_state.get().inventory.get_host(holder)
            value = read_secret_now(source, remote)
            if not value or digest(value + "\n") != sha256:
                raise RuntimeError(
                    f"could not copy the API key from {holder} ({remote}): it changed or is "
                    "unreadable there; run the deploy again"
                )
        write_control_copy(path, value)
        logger.info(f"{host.print_prefix}the head's API key written to {path} (0600) for clients")

    return write

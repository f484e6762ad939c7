"""Helper calls that cannot be replayed: a MAC with the pair secret over each request.

The agents' /start and /stop and the supervisor's /restart-pair carry three headers instead of
the secret itself (docs/attack-surface-facts.md section 4):

    X-Sparkrig-Time   unix seconds when the request was signed
    X-Sparkrig-Nonce  32 random hex digits, never sent twice
    X-Sparkrig-Mac    HMAC-SHA256 over method, path, receiver, time, nonce and the body's SHA-256

The key is derived from the secret once (domain separation: the raw secret never signs). The
receiver is the listener's own ``ip:port``, so a request captured on its way to one worker fails
on another. A receiver refuses a time outside its window (30 s: long enough for a clock a few
seconds off, short enough that its nonce cache stays small) and any nonce it saw inside it.

Stdlib only."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Mapping

from sparkhost import tokenfile

MIN_SECRET = 32  # sparkrig makes 48 hex digits (sparkrig/pairsecret.py new_token)
WINDOW_S = 30.0
NONCE_CAP = 4096  # far above the few requests a minute the pair makes
TIME, NONCE, MAC = "X-Sparkrig-Time", "X-Sparkrig-Nonce", "X-Sparkrig-Mac"
FIELDS = (TIME, NONCE, MAC)
_FORMAT = {
    TIME: re.compile(r"[0-9]{1,12}"),
    NONCE: re.compile(r"[0-9a-f]{32}"),
    MAC: re.compile(r"[0-9a-f]{64}"),
}
_CONTEXT = b"sparkrig pair mac v1"
FIX = "re-run the deploy (pyinfra inventory.py deploy.py): it installs the pair secret"


class SecretError(ValueError):
    """The pair secret cannot sign: missing, empty or short. The message names the file and fix."""


def load_secret(path: str) -> bytes:
    """The pair secret in ``path`` as a derived signing key; SecretError when it is missing,
    empty or shorter than MIN_SECRET (an empty one would make every MAC a public one)."""
    try:
        secret = tokenfile.read_secret(path) or ""
    except (OSError, UnicodeDecodeError) as err:
        raise SecretError(f"the pair secret {path} cannot be read ({err}); {FIX}") from None
    if len(secret) < MIN_SECRET:
        raise SecretError(
            f"the pair secret {path} is {'empty' if not secret else 'too short'} "
            f"({len(secret)} characters, at least {MIN_SECRET} needed); {FIX}"
        )
    return derive(secret)


def derive(secret: str) -> bytes:
    return hmac.new(secret.encode(), _CONTEXT, hashlib.sha256).digest()


def mac(
    key: bytes, method: str, path: str, receiver: str, when: str, nonce: str, body: bytes = b""
) -> str:
    text = "\n".join([method, path, receiver, when, nonce, hashlib.sha256(body).hexdigest()])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign(
    key: bytes,
    method: str,
    path: str,
    receiver: str,
    body: bytes = b"",
    now: float | None = None,
    nonce: str = "",
) -> dict[str, str]:
    """The headers of one request to ``receiver`` (``ip:port``, as the URL names it)."""
    when = str(int(time.time() if now is None else now))
    nonce = nonce or secrets.token_hex(16)
    return {TIME: when, NONCE: nonce, MAC: mac(key, method, path, receiver, when, nonce, body)}


UNSIGNED = "unsigned"  # all a sender without the secret learns


class Verifier:
    """A receiver's check of signed requests: format, MAC, window, then the nonce, so no state
    changes before the MAC is good. Thread-safe (the helpers answer each request in a thread)."""

    def __init__(self, key: bytes, window: float = WINDOW_S, cap: int = NONCE_CAP) -> None:
        self.key, self.window, self.cap = key, window, cap
        self.seen: dict[str, float] = {}  # nonce -> when it leaves the window
        self.lock = threading.Lock()

    def check(
        self,
        headers: Mapping[str, str],
        method: str,
        path: str,
        receiver: str,
        body: bytes = b"",
        now: float | None = None,
    ) -> tuple[int, str]:
        """(0, "") for a good request, else (HTTP status, why): 401 UNSIGNED (malformed or a
        wrong MAC), 401 stale (a good MAC out of the window: why says by how much, for the ranks'
        clocks), 409 a replay, 503 the nonce cache full."""
        now = time.time() if now is None else now
        given = {name: headers.get(name) or "" for name in _FORMAT}
        if not all(rx.fullmatch(given[name]) for name, rx in _FORMAT.items()):
            return 401, UNSIGNED
        want = mac(self.key, method, path, receiver, given[TIME], given[NONCE], body)
        if not hmac.compare_digest(want.encode(), given[MAC].encode()):
            return 401, UNSIGNED
        skew = int(given[TIME]) - now
        if abs(skew) > self.window:
            return 401, (
                f"stale: signed {skew:+.0f} s from this rank's clock (window {self.window:.0f} s):"
                " a captured request, or the ranks' clocks disagree (timedatectl on both)"
            )
        with self.lock:
            self.seen = {n: t for n, t in self.seen.items() if t > now}
            if given[NONCE] in self.seen:
                return 409, "replayed: this request was already answered"
            if len(self.seen) >= self.cap:  # never evict a live nonce: that reopens a replay
                return 503, "too many requests in the window"
            self.seen[given[NONCE]] = int(given[TIME]) + self.window + 1  # then out of the window
        return 0, ""

"""Two pairs and more behind one endpoint (docs/pairs.md): every pair's head balances the API over
every serving pair, and a pair that restarts drains out of the balance first.

How a request flows. A client asks any head's front (``api_port``). That front checks the key,
then passes the request to one member of ``sparkrig_pairs``: every head's front, this one's on
loopback among them, over TLS verified with the endpoint's one CA (each head's certificate
carries ``ENDPOINT_NAME``). The member serves it on its own pair: a request carrying
``LOCAL_HEADER`` is never balanced again, it goes to that head's engine. A member that refuses
the connection, answers 502/503/504/500 or times out on connect is left for ``FAIL_S`` seconds
and the request goes to the next one (before any byte of an answer reached the client: a stream
stays on the pair that began it).

Draining. A pair about to restart (a release change, a repair) sets its drain include
(``drain_include``): from then its front answers 503 to every balanced request, so every front,
its own included, sends new requests to the other pairs, while the requests in flight finish (up
to ``drain_timeout_s``). The head's own gates, the soak and the bench gate pin the pair with
``LOCAL_HEADER: gate``, which draining lets through: a pair is proven on its own before it is
put back into the balance, at the end of the run.

What lives here: who the members are and the drain include's text (pure); sparkrig/drain.py has
the commands that drain and restore a pair."""

from __future__ import annotations

from sparkhost.gate import LOCAL_HEADER, PINNED

from sparkrig.config.model import Settings

ENDPOINT_NAME = "sparkrig-endpoint"  # every head's certificate carries it: the fronts verify it
# LOCAL_HEADER (sparkhost.gate) set: served by this pair alone, never balanced again; PINNED
# its value from the gates, the soak and the bench gate (never refused), BALANCED a front's
BALANCED = "balanced"
__all__ = ["LOCAL_HEADER", "PINNED"]
PAIR_HEADER = "X-Sparkrig-Pair"  # the answer names the pair that served it
FAIL_S = 10  # a member that failed is left this long before it is tried again


def balanced(s: Settings) -> bool:
    """Whether this head's front balances over several pairs (the inventory names pairs)."""
    return s.me.is_head and bool(s.other_heads)


def members(s: Settings) -> list[str]:
    """``host:port`` of every front in this head's balance: its own on loopback first, then every
    other pair's head at its LAN address (host data lan_address, which the config requires of
    every head of several pairs), in inventory order."""
    port = s.knobs.api_port
    return [f"127.0.0.1:{port}", *(f"{h.lan_address}:{port}" for h in s.other_heads)]


def drain_include(s: Settings) -> str:
    """The drain include's path on the head (owned by the front phase)."""
    return f"{s.knobs.config_dir}/api-drain.conf"


def drain_text(drained: bool) -> str:
    """The drain include: ``$sparkrig_drained`` 1 while the pair is out of the balance."""
    return (
        "# sparkrig: 1 while this pair drains out of the endpoint's balance\n"
        f"geo $sparkrig_drained {{\n    default {1 if drained else 0};\n}}\n"
    )

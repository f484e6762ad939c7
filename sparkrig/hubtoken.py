"""The Hub token of the control machine, found one way for the deploy and the lockfile command.

``hub_token`` is huggingface_hub's own ``get_token()`` (2.4, huggingface_hub/utils/_auth.py),
which takes the first of: a Trusted-Publishers OIDC exchange when HF_OIDC_RESOURCE is set, the
HF_TOKEN environment variable (then the older HUGGING_FACE_HUB_TOKEN), the file `hf auth login`
writes (HF_TOKEN_PATH, by default $HF_HOME/token, i.e. ~/.cache/huggingface/token). The deploy
copies it to the head, whose fetcher alone talks to the Hub. A repo the Hub marks gated is listed
without a token but its files are not served without one (huggingface.js#945), so a gated repo
with no token is refused on the control machine, naming the repo (``missing_for``).
"""

from __future__ import annotations

LOG_IN = (
    "accept its terms on its Hub page, then log in on this machine with `hf auth login` "
    "(or export HF_TOKEN=hf_...)"
)


def hub_token() -> str | None:
    """The token huggingface_hub would send, or None when this machine has none."""
    from huggingface_hub import get_token

    return get_token()


def missing_for(repo: str, gated: object, endpoint: str) -> str | None:
    """Why ``repo`` cannot be fetched (gated: the Hub's ``gated`` field, False, "auto" or
    "manual", as its lockfile records it) when no token is found; None when it can."""
    if not gated or hub_token() is not None:
        return None
    page = f"{endpoint.rstrip('/')}/{repo}"
    return (
        f"{repo} is gated on the Hub ({gated} approval) and no Hub token was found: {LOG_IN}; "
        f"its page: {page}"
    )


def in_clear(repo: str, gated: object, endpoint: str) -> str | None:
    """Why the token may not go to ``endpoint``: a gated ``repo``'s fetch sends it, and a plain
    ``http://`` endpoint off loopback carries it across the network in clear. None when not."""
    from urllib.parse import urlsplit

    host = urlsplit(endpoint).hostname or ""
    if not gated or not endpoint.startswith("http://") or hub_token() is None:
        return None
    if host == "localhost" or host.startswith("127.") or host == "::1":
        return None
    return (
        f"{repo} is gated, so the head's fetch sends the Hub token to hub_endpoint {endpoint}, "
        "which is plain HTTP: the token would cross the network in clear; use the https:// "
        "address of the Hub or of the mirror"
    )

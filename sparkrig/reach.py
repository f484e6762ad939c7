"""The head's reach of the internet, asked only when something must come from it: the Hub
(``hub_endpoint``) while the head's weights are incomplete, the base image's registry while the
head lacks the pinned image. A converged pair never needs the internet, so it is never asked.

One command (``Reach``), sent by preflight on the head after its state read, not part of that
read (a no-op run must not touch the network): the host's own python3 asks each URL once, with
no proxy, as the fetcher does (files/sparkhost/fetch.py speaks http.client directly). Any HTTP
answer, 401 included, means reached (HTTPS, or plain HTTP when the TLS handshake fails); a DNS,
connect or time-out error means not."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

from sparkrig.config.model import Settings
from sparkrig.factlines import END
from sparkrig.hostpkg import PYTHON

TIMEOUT_S = 8  # per URL
DOCKER_HUB = "registry-1.docker.io"  # where docker pulls an image named without a registry

# A registry that speaks plain HTTP (docker falls back to it for an insecure registry, as the
# lab's is) fails the TLS handshake: it is asked again over http://.
_REACH_SCRIPT = f"""
import ssl, sys, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
def status(url):
    try:
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout={TIMEOUT_S}) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
for url in sys.argv[1:]:
    try:
        try:
            said = status(url)
        except urllib.error.URLError as e:
            if not (isinstance(e.reason, ssl.SSLError) and url.startswith("https://")):
                raise
            said = f"{{status('http://' + url[len('https://'):])}} over http"
        print("ok", url, said)
    except Exception as e:
        why = str(getattr(e, "reason", "") or e or type(e).__name__)
        print("fail", url, why.replace(chr(10), " "))
print("{END}")
"""


def registry_of(image: str) -> str:
    """The registry host docker pulls ``image`` from (docker's rule: a first path component
    with a dot or a port, or ``localhost``, names one; otherwise Docker Hub)."""
    first, slash, _ = image.partition("@")[0].partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def hub_url(s: Settings) -> str:
    return f"{s.knobs.hub_endpoint.rstrip('/')}/api/models/{s.model.repo}"


def registry_url(image: str) -> str:
    return f"https://{registry_of(image)}/v2/"


@dataclass(frozen=True)
class Reached:
    url: str
    ok: bool
    said: str  # the HTTP status, or why it was not reached


class Reach(FactBase[tuple[Reached, ...]]):
    """
    Whether the host reaches each of ``urls`` (one HEAD request each, no proxy, 8 s).
    """

    default = tuple

    def command(self, urls: tuple[str, ...]) -> StringCommand:
        return StringCommand(PYTHON, "-c", QuoteString(_REACH_SCRIPT), *map(QuoteString, urls))

    def process(self, output: list[str]) -> tuple[Reached, ...]:
        if END not in output:
            raise FactProcessError("reach ended early (no end marker)")
        out = []
        for line in output:
            verdict, _, rest = line.partition(" ")
            if verdict in ("ok", "fail"):
                url, _, said = rest.partition(" ")
                out.append(Reached(url, verdict == "ok", said))
        return tuple(out)


def wanted_urls(
    s: Settings, weights_missing: bool, image_missing: bool, archive: str = ""
) -> dict[str, str]:
    """url -> what the head must download from it and what else to check there (``archive``:
    the package archive apt installs the missing nginx from; "" when nothing is installed)."""
    k, urls = s.knobs, {}
    if archive:
        urls[archive] = (
            "nginx, the API front, from its package archive (apt-get install nginx; apt "
            "goes through its own proxy settings: if the head reaches it only through those, "
            "set reach_check = False)"
        )
    if weights_missing:
        urls[hub_url(s)] = (
            f"the weights from the Hub (hub_endpoint {k.hub_endpoint}; the fetcher connects "
            "directly, through no proxy)"
        )
    if image_missing:
        urls[registry_url(s.image_ref)] = (
            f"the base image {s.image_ref.partition('@')[0]} from its registry (docker pulls "
            "through its own proxy settings: if the head reaches it only through those, set "
            "reach_check = False)"
        )
    return urls


def reach_problems(wanted: dict[str, str], reached: tuple[Reached, ...]) -> list[str]:
    """Each URL the head must download from and did not reach, with what to check."""
    said = {r.url: r for r in reached}
    out = []
    for url, what in wanted.items():
        got = said.get(url)
        if got is not None and got.ok:
            continue
        why = got.said if got is not None else "no answer"
        out.append(
            f"the head does not reach {url} ({why}) and must download {what}: check the head's "
            f"DNS, route and firewall (`curl -I {url}` there), then run again"
        )
    return out

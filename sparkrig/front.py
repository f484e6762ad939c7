"""The API front (docs/front.md): nginx on the head serves ``api_port`` and checks the key on every
route but a plain ``/health``; the engine listens on ``127.0.0.1:engine_port`` only.

Why a front at all: vLLM's key guards only ``/v1 /v2 /inference /cohere``; ``/invocations`` (full
inference), ``/tokenize``, ``/metrics`` and the docs answer anyone (docs/attack-surface-facts.md
1.1). Why nginx: the Debian/Ubuntu distribution package the field runs, security-supported in
Ubuntu's main, with a per-address connection cap, ``nginx -t`` before a reload, and a config
that is static text (docs/front.md, "Why nginx").

What lives here: the paths, the builders of the site file, of the key include and of nginx's
restart drop-in (pure), the front's files as a run wants them (``wanted_files``), the state
read's part saying whether nginx is installed, and the operation that installs it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.exceptions import FactProcessError
from sparkhost.gate import REFUSED_PATH

from sparkrig import endpoint
from sparkrig.config.knobs import Knobs
from sparkrig.config.model import Settings, api_scheme
from sparkrig.factlines import END
from sparkrig.fronttls import FrontTls, head_ca_path, head_cert_path, uses_pair_ca
from sparkrig.gates import LoopbackTls, gate_command
from sparkrig.owned import (
    PathState,
    apt_installed_command,
    dropin_path,
    file_absent,
    file_present,
    secret_installed,
)
from sparkrig.pairsecret import API_ROTATE_HOW, Secret
from sparkrig.paths import paths
from sparkrig.render import base_context, render
from sparkrig.stateread import Part, Values, read_here

PACKAGE = "nginx"  # Debian's and Ubuntu's nginx (nginx-common, the binary at /usr/sbin/nginx)
SERVICE = "nginx.service"
SITE = "/etc/nginx/conf.d/sparkrig-api.conf"  # conf.d: Debian's default site stays untouched
# nginx.service is the distribution's (Restart=no): the front's restart is a drop-in beside it
RESTART_DROPIN = dropin_path(SERVICE, "sparkrig")
RESTART_S = 2  # a killed front answers again within seconds (a rank container takes ~2 min)
START_LIMIT = (5, 60)  # starts, seconds: a front failing this often is given up (a broken config)
# set when the deploy installed nginx (uninstall then stops it; an operator's nginx keeps running)
INSTALLED_MARK = "/var/lib/sparkrig/nginx-installed-by-sparkrig"
# RFC 6750's b64token: the characters a Bearer credential may hold (the key include's regex
# escapes the two of them that mean something in PCRE)
TOKEN68 = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def front_paths(s: Settings) -> dict[str, str]:
    """The front's files on the head: the site, the key include, the TLS pair and nginx's
    restart drop-in."""
    d = s.knobs.config_dir
    return {
        "site": SITE,
        "restart_dropin": RESTART_DROPIN,
        "key_include": f"{d}/api-front-key.conf",
        "tls_cert": head_cert_path(s),
        "tls_key": f"{d}/api-front.key",
        "tls_ca": head_ca_path(s),
    }


def api_key_file(s: Settings) -> str | None:
    """The head's API key file (raw key, 0600 root) for the gates and the watchdog's probe; None
    when the API is open (``api_auth = False``) or on a worker (no API there)."""
    return paths(s).api_key if s.knobs.api_auth and s.me.is_head else None


def front_gate_command(s: Settings) -> list[str]:
    """The gates' argv on the head, through the API front on loopback: the key (where the API
    asks for one) and the front's certificate (where it speaks TLS), as a client would."""
    k = s.knobs
    return gate_command(
        k.install_dir,
        k.api_port,
        k.served_model_name,
        key_file=api_key_file(s),
        tls=loopback_tls(s),
    )


def loopback_tls(s: Settings) -> LoopbackTls | None:
    """How the head's own gates reach its front: None over HTTP (api_tls off), else verified
    with the pair's CA installed beside the front, or unverified for the operator's
    certificate."""
    if not s.knobs.api_tls:
        return None
    return LoopbackTls(head_ca_path(s) if uses_pair_ca(s) else "")


def front_files(s: Settings) -> list[str]:
    """The files the front phase owns on this host (the head's; none on a worker)."""
    if not s.me.is_head:
        return []
    drain = [endpoint.drain_include(s)] if endpoint.balanced(s) else []
    return [*front_paths(s).values(), *drain]


def site_context(s: Settings) -> dict[str, Any]:
    """The site template's context (templates/sparkrig-api.conf.j2)."""
    k, p = s.knobs, front_paths(s)
    tls = k.api_tls
    return {
        **balance_context(s),
        **base_context(s),
        "api_port": k.api_port,
        "engine_port": k.engine_port,
        "auth": k.api_auth,
        "key_include": p["key_include"],
        "cors_origins": list(k.api_cors_origins),
        "conn_per_ip": k.api_conn_per_ip,
        "tls": tls,
        "tls_cert": p["tls_cert"] if tls else "",
        "tls_key": p["tls_key"] if tls else "",
        "refused_path": REFUSED_PATH,
    }


def balance_context(s: Settings) -> dict[str, Any]:
    """The site's part for several pairs behind one endpoint (sparkrig/endpoint.py); only
    ``balanced`` False for one pair."""
    if not endpoint.balanced(s):
        return {"balanced": False}
    lan = [str(h.lan_address) for h in s.pair_heads if h.lan_address is not None]
    return {
        "balanced": True,
        "pair": s.pair,
        "members": endpoint.members(s),
        "front_ips": list(dict.fromkeys(["127.0.0.1", *lan])),
        "fail_s": endpoint.FAIL_S,
        "scheme": api_scheme(s.knobs),
        "drain_include": endpoint.drain_include(s),
        "local_header": endpoint.LOCAL_HEADER,
        "local_var": endpoint.LOCAL_HEADER.lower().replace("-", "_"),
        "pinned": endpoint.PINNED,
        "balanced_value": endpoint.BALANCED,
        "pair_header": endpoint.PAIR_HEADER,
        "endpoint_name": endpoint.ENDPOINT_NAME,
        "tls_ca": front_paths(s)["tls_ca"],
    }


def site_text(s: Settings) -> str:
    """The nginx site file of the head's front."""
    return render("sparkrig-api.conf.j2", **site_context(s))


def restart_dropin_text() -> str:
    """nginx.service's drop-in that restarts a killed or crashed front (templates/
    nginx-restart.conf.j2): ``Restart=on-failure`` after ``RESTART_S``, given up after
    ``START_LIMIT``."""
    burst, interval = START_LIMIT
    return render("nginx-restart.conf.j2", restart_s=RESTART_S, burst=burst, interval=interval)


def key_include_text(key: str) -> str:
    """The 0600 include that holds the key: a map of the Authorization header to
    ``$sparkrig_api_key_ok`` (1 only for ``Bearer <key>``; the scheme in any case as RFC 6750 and
    vLLM take it, the key case-sensitive and whole). nginx's master reads it as root at start and
    reload, so the key is in no argv, environment or ``ps``. ValueError for a key that is not a
    Bearer token (RFC 6750 b64token) or is empty."""
    if not key or not TOKEN68.fullmatch(key):
        raise ValueError(
            "the API key must be a Bearer token (RFC 6750: letters, digits and -._~+/, "
            "then = padding); write a new one to api_key_file or set api_key_rotate = True"
        )
    pattern = re.sub(r"([.+])", r"\\\1", key)
    return (
        "# sparkrig's API key for the front (0600 root: nginx's master reads it; never in argv)\n"
        "map $http_authorization $sparkrig_api_key_ok {\n"
        "    default 0;\n"
        f'    "~^(?i:bearer) {pattern}$" 1;\n'
        "}\n"
    )


def tls_text(path: str, what: str) -> str:
    """A TLS file from the control side (``tls_cert``/``tls_key``, relative to the deploy's
    directory, as api_key_file is); ValueError naming the knob when it cannot be read or holds
    no PEM block."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as err:
        raise ValueError(f"{what}: cannot read {path}: {err.strerror or err}") from None
    if "-----BEGIN " not in text:
        raise ValueError(f"{what}: {path} holds no PEM block")
    return text


@dataclass(frozen=True)
class FrontFile:
    """One of the front's files as the run wants it on the head: the operation's name, the path,
    the text (None: the file is removed) and whether it is a secret (0600 root, never diffed or
    in a command line: ``secret_installed``)."""

    name: str
    dest: str
    text: str | None = None
    secret: bool = False

    def operation(self) -> tuple[Any, dict[str, str]]:
        """The operation that owns the file, and its arguments."""
        if self.text is None:
            return file_absent, {"path": self.dest}
        op = secret_installed if self.secret else file_present
        return op, {"text": self.text, "dest": self.dest}


def wanted_files(
    s: Settings, head: Knobs, api: Secret | None, tls: FrontTls | None
) -> list[FrontFile]:
    """The front's files in the order the phase owns them: the key include, the TLS pair (and
    the pair's CA certificate), the site. ``head``: the head's knobs (the key and TLS are the
    head's business); ``api``: the run's API key (sparkrig/pairsecret.py); ``tls``: the run's
    certificate from the pair's CA (sparkrig/fronttls.py). The include is installed when the
    key is known here, removed while ``api_auth`` is off, and left alone when the head's key is
    known by digest only (preflight refuses a head lacking it: ``key_include_lost``). The TLS
    pair is the operator's (tls_cert, tls_key) or the pair's CA's, and removed while ``api_tls``
    is off. ValueError naming the knob for a TLS file that cannot be read or a key that is no
    Bearer token."""
    p = front_paths(s)
    files: list[FrontFile] = []
    if head.api_auth and api is not None and api.token:
        include = key_include_text(api.token)
        install = "Install the API front's key include"
        files.append(FrontFile(install, p["key_include"], include, secret=True))
    elif not head.api_auth:
        off = "Remove the API front's key include while api_auth is off"
        files.append(FrontFile(off, p["key_include"]))
    cert_name, key_name = (
        "Install the API front's TLS certificate",
        "Install the API front's TLS key",
    )
    if head.tls_cert is not None and head.tls_key is not None:
        cert, key = tls_text(head.tls_cert, "tls_cert"), tls_text(head.tls_key, "tls_key")
        files.append(FrontFile(cert_name, p["tls_cert"], cert))
        files.append(FrontFile(key_name, p["tls_key"], key, secret=True))
        files.append(FrontFile("Remove the pair's CA while the front serves the operator's "
                               "certificate", p["tls_ca"]))  # fmt: skip
    elif head.api_tls and tls is not None and tls.cert:
        files.append(FrontFile(cert_name, p["tls_cert"], tls.cert))
        files.append(FrontFile(key_name, p["tls_key"], tls.key, secret=True))
        files.append(FrontFile("Install the pair's CA for the head's own gates", p["tls_ca"],
                               tls.ca_cert))  # fmt: skip
    elif not head.api_tls:
        http = "Remove the API front's TLS files while it serves HTTP"
        files += [FrontFile(http, p[f]) for f in ("tls_cert", "tls_key", "tls_ca")]
    files.append(FrontFile("Install the API front's nginx site", p["site"], site_text(s)))
    return files


def key_include_lost(s: Settings, api: Secret | None, include: PathState | None) -> str:
    """Why preflight refuses the head (only it) when the front's key include is not there and the
    control side has no copy of the key the head holds (``api`` known by digest only): the deploy
    never reads a secret back to write a file, so the include cannot be written, and the site
    would name a missing file (``nginx -t`` fails, a running nginx fails at its next start).
    "" when the include is there, the key is known here, or nothing about it is decided."""
    if not s.me.is_head or api is None or api.problem or api.known or not api.sha256:
        return ""
    if include is not None and include.kind == "file":
        return ""
    key_file, held = s.knobs.api_key_file, paths(s).api_key
    return (
        f"the API front's key include {front_paths(s)['key_include']} is missing and "
        f"api_key_file ({key_file}) holds no copy of the API key the head holds ({held}), so it "
        f"cannot be written: copy the head's key to {key_file} (on the head: sudo cat {held}) "
        f"and run again, or {API_ROTATE_HOW}"
    )


# ---------------------------------------------------------------------------------------------
# The fact: is nginx installed here (the state read's part), and the operation installing it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrontPackageReport:
    installed: bool = False
    archive: str = ""  # when nginx is missing: the first package archive apt reads, its URI


# the first URI of apt's sources (one-line .list files and deb822 .sources alike)
ARCHIVE_URI = (
    "cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources "
    "2>/dev/null | grep -vE '^[[:space:]]*#' | grep -oE 'https?://[^[:space:]]+' | head -n1"
)


class FrontPackage(FactBase[FrontPackageReport]):
    """
    Whether the distribution's nginx is installed (dpkg says ``install ok installed`` and the
    binary is there), and when it is not, where apt would fetch it from.
    """

    default = FrontPackageReport

    def command(self) -> str:
        return (
            f"if dpkg-query -W -f='${{Status}}' {PACKAGE} 2>/dev/null "
            "| grep -q 'ok installed' && [ -x /usr/sbin/nginx ]; "
            f'then echo nginx=installed; else echo nginx=missing; echo "archive=$({ARCHIVE_URI})"; '
            f"fi; echo '{END}'"
        )

    def process(self, output: list[str]) -> FrontPackageReport:
        if END not in output:
            raise FactProcessError("front: ended early (no end marker)")
        archive = next((x[8:] for x in output if x.startswith("archive=")), "")
        return FrontPackageReport("nginx=installed" in output, archive)


def front_part() -> Part:
    """The state read's part saying whether nginx is installed."""
    return Part("front", FrontPackage)


def installed(values: Values) -> bool:
    report: FrontPackageReport = values.get("front", FrontPackage)
    return report.installed


def archive_of(values: Values) -> str:
    """The package archive the head would install nginx from ("" when nginx is installed)."""
    report: FrontPackageReport = values.get("front", FrontPackage)
    return "" if report.installed else report.archive


INSTALL = apt_installed_command(PACKAGE)


@operation()
def front_package_installed() -> Generator[Any, None, None]:
    """
    Install the distribution's nginx when it is missing, and mark that sparkrig installed it
    (uninstall then stops it). Debian's package enables its own default site on port 80; when
    sparkrig installed the package, that link goes (nothing of the operator's was there).
    """
    if installed(read_here("front")):
        host.noop("nginx is installed")
        return
    script = (
        f"set -e; {INSTALL}; mkdir -p {shlex.quote(str(Path(INSTALLED_MARK).parent))}; "
        f"touch {shlex.quote(INSTALLED_MARK)}; rm -f /etc/nginx/sites-enabled/default"
    )
    yield StringCommand("sh", "-c", QuoteString(script))


def aside_for_older_release(rank_unit: str) -> str:
    """The rollback's shell command on the head: when the restored rank unit is from before the
    front (its engine not on the loopback: it binds api_port itself), the front's site goes and
    nginx reloads, so the previous release's engine gets its port back (the next deploy puts the
    site back). A unit of a release with the front leaves everything as it is."""
    unit, site = shlex.quote(rank_unit), shlex.quote(SITE)
    return (
        f"grep -qF -- '--host 127.0.0.1' {unit} || "
        f"{{ rm -f {site} && nginx -t -q && systemctl reload {SERVICE}; }}"
    )


# The gates a rollback runs: the previous release may be from before the front, whose engine
# answers /invocations bare (no locked gate then); the next deploy runs all five again
ROLLBACK_GATES = ("health", "models", "math", "tool")


def check_and_reload() -> str:
    """The shell command that validates the whole nginx config, then reloads a running nginx or
    starts a stopped one: a config that fails ``nginx -t`` never reaches the running front."""
    return "nginx -t -q && { systemctl reload nginx.service || systemctl restart nginx.service; }"

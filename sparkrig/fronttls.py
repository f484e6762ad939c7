"""The API front's certificate when the operator brings none: a CA of the endpoint's own.

The CA lives on the control machine beside the pair's other control copies (``api_tls_dir``,
default ``.sparkrig/tls``): ``ca.key`` (0600) and ``ca.crt``; each head's front key and
certificate (``front.key`` 0600, ``front.crt``) are issued from it for every name a client may
dial that head by (``tls_names``) and installed on it; ``front.sha256`` holds the certificate's
fingerprint. An inventory of several pairs behind one endpoint has one CA for all of them and a
front certificate per head, named after its pair (``front-<pair>.key``, ``.crt``, ``.sha256``).
Clients verify with ``ca.crt`` (``curl --cacert .sparkrig/tls/ca.crt``); the bench, the release's
bench gate and the head's own gates do the same.

A run keeps what is there: a front's certificate is issued again only when a name it must carry
is missing, it is no longer signed by the CA, or it ends within ``RENEW_DAYS``; the CA is made
only when none is here, once for every head of the run. A control machine without the CA while a
head already serves a certificate (a fresh clone, a second operator) is refused before anything
changes: a new CA would turn away every client that trusts the old one (``api_tls_rotate`` makes
one on purpose, with every pair's head in the run).

The files are made when the run is planned, ``--dry`` included, so the diff shows the certificate
the run installs; only the control machine is written then, never a host."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sparkrig.config.api import api_ca_file
from sparkrig.config.inventory import for_inventory
from sparkrig.config.model import Settings, for_pair
from sparkrig.endpoint import ENDPOINT_NAME
from sparkrig.runscope import once_per_run
from sparkrig.secretio import SecretDigest, write_control_file
from sparkrig.stateread import Part, Values

CA_DAYS = 3650  # the pair's CA outlives its hardware
CERT_DAYS = 397  # the longest a browser accepts for a server certificate (CA/B Forum)
RENEW_DAYS = 30  # a certificate ending sooner is issued again by the next run
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")  # the head's own gates dial loopback


@dataclass(frozen=True)
class TlsFiles:
    """Where the endpoint's CA and one head's front certificate live on the control machine.

    + dir: api_tls_dir
    + pair: the head's pair ("" for an inventory of one cluster): its certificate's files are
      ``front-<pair>.*`` (``for_pair``), the CA's the same for every pair"""

    dir: Path
    pair: str = ""

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def front(self) -> str:
        """The stem of the head's files: ``front``, or ``front-<pair>`` for a named pair."""
        return for_pair("front", self.pair)

    @property
    def key(self) -> Path:
        return self.dir / f"{self.front}.key"

    @property
    def cert(self) -> Path:
        return self.dir / f"{self.front}.crt"

    @property
    def fingerprint(self) -> Path:
        return self.dir / f"{self.front}.sha256"


@dataclass(frozen=True)
class FrontTls:
    """The run's decision about the front's certificate (``pair_tls``)."""

    cert: str = ""  # PEM, what the head serves
    key: str = ""  # PEM, the head's 0600 key ("" when refused)
    ca_cert: str = ""  # PEM, what clients trust (installed on the head for its own gates)
    fingerprint: str = ""  # sha256 of the certificate (DER), colon-separated hex
    said: str = ""  # what the run made, for its log ("" when it kept everything)
    problem: str = ""  # non-empty: refused before any host changes


def tls_names(s: Settings) -> tuple[str, ...]:
    """Every name a client may dial the head's API by: loopback (the head's gates), the head's
    inventory name and SSH address, its LAN address, the host of its ``api_url``, and the
    operator's ``api_tls_names``; behind one endpoint of several pairs, ``ENDPOINT_NAME``."""
    head, k = s.head, s.knobs
    names = [*LOOPBACK_NAMES, head.name, head.address, *k.api_tls_names]
    if s.other_heads:  # the name every front of the endpoint verifies the others by
        names.append(ENDPOINT_NAME)
    if head.lan_address is not None:
        names.append(str(head.lan_address))
    if head.api_url:
        host = head.api_url.split("://", 1)[1].split("/", 1)[0]
        names.append(host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0])
    return tuple(dict.fromkeys(n.lower() for n in names if n))


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _names_of(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    dns = san.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return {n.lower() for n in [*dns, *ips]}


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def fingerprint(cert_pem: str) -> str:
    """The certificate's SHA-256 fingerprint as browsers and ``openssl x509 -fingerprint``
    show it."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(label: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A CA for one pair (``label``: its head's name), P-256, path length 0 (it signs the front's
    certificate and nothing below it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sparkrig pair CA ({label})")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, names: Iterable[str]
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The front's key and certificate for ``names`` (the first is its common name), signed by
    the pair's CA, for TLS servers only."""
    names = list(names)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def why_reissue(cert: x509.Certificate, ca_cert: x509.Certificate, names: Iterable[str]) -> str:
    """Why the front's certificate must be issued again ("" when it serves as it is)."""
    missing = sorted(set(names) - _names_of(cert))
    if missing:
        return f"it lacks {', '.join(missing)}"
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return "the pair's CA did not sign it"
    left = cert.not_valid_after_utc - _now()
    if left < datetime.timedelta(days=RENEW_DAYS):
        return f"it ends in {max(left.days, 0)} days"
    return ""


def _load(files: TlsFiles) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    if not (files.ca_key.exists() and files.ca_cert.exists()):
        return None
    key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{files.ca_key} is not an EC private key sparkrig made")
    return key, x509.load_pem_x509_certificate(files.ca_cert.read_bytes())


def lost_ca(files: TlsFiles) -> str:
    return (
        f"the head serves the API front's certificate of a CA this machine does not hold "
        f"({files.ca_key} is missing): a new CA would turn away every client that trusts the "
        f"pair's; copy {files.dir} from the control machine that deployed the pair (it holds "
        f"the CA), or set api_tls_rotate = True for one run to make a new CA (clients must "
        f"then trust the new {files.ca_cert})"
    )


def decide(
    files: TlsFiles, names: tuple[str, ...], label: str, head_holds: bool, rotate: bool
) -> FrontTls:
    """Keep, issue or make the pair's CA (named after ``label``, the head) and the front's
    certificate in ``files`` for ``names``. ``head_holds``: the head already serves a
    certificate; ``rotate``: make a new CA even so. ValueError naming the directory for a file
    that cannot be read."""
    return decide_heads([(files, names)], label, head_holds, rotate)[0]


def decide_heads(
    fronts: list[tuple[TlsFiles, tuple[str, ...]]],
    label: str,
    head_holds: bool,
    rotate: bool,
    missing: tuple[str, ...] = (),
) -> list[FrontTls]:
    """``decide`` for every head of the endpoint in the run at once, in order: one CA (in the
    first head's ``api_tls_dir``: the same for every head), kept, made (at most once) or refused
    for all, then each head's own certificate (``fronts``: its files and its names) kept or
    issued from it. ``head_holds``: some head already serves a certificate; ``missing``: heads of
    the endpoint not in the run (a new CA would not be theirs: refused). What the CA's making
    says is said with the first head's result."""
    files = fronts[0][0]
    try:
        loaded = None if rotate else _load(files)
    except (OSError, ValueError) as err:
        raise ValueError(f"api_tls_dir: cannot read the pair's CA in {files.dir}: {err}") from None
    said = []
    if loaded is None:
        if head_holds and not rotate:
            return [FrontTls(problem=lost_ca(files))] * len(fronts)
        if missing:
            return [FrontTls(problem=ca_needs_every_head(files, missing, rotate))] * len(fronts)
        ca_key, ca_cert = make_ca(label)
        write_control_file(files.ca_key, _pem_key(ca_key), secret=True)
        write_control_file(files.ca_cert, _pem(ca_cert), secret=False)
        said.append(f"made the pair's CA {files.ca_cert}")
    else:
        ca_key, ca_cert = loaded
    out = []
    for head_files, names in fronts:
        out.append(_front(head_files, names, ca_key, ca_cert, said))
        said = []
    return out


def ca_needs_every_head(files: TlsFiles, missing: tuple[str, ...], rotate: bool) -> str:
    """Why no CA is made while a head of the endpoint is out of the run (``--limit``)."""
    why = "api_tls_rotate makes a new CA" if rotate else f"{files.ca_key} is missing"
    return (
        f"{why}, and {', '.join(missing)} not in the run: a new CA made now would not be the "
        f"one {'they serve' if len(missing) > 1 else 'it serves'}, and clients trusting "
        f"{files.ca_cert} would be turned away there; run the deploy with every pair's head"
    )


def _front(
    files: TlsFiles,
    names: tuple[str, ...],
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    said: list[str],
) -> FrontTls:
    """One head's front certificate in ``files``, kept or issued from the CA; ``said``: what the
    run made so far, said first."""
    said = list(said)
    why = "no certificate yet"
    if files.cert.exists() and files.key.exists():
        try:
            cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
            why = why_reissue(cert, ca_cert, names)
        except ValueError:
            why = f"{files.cert} holds no certificate"
    if why:
        key, cert = issue(ca_key, ca_cert, names)
        write_control_file(files.key, _pem_key(key), secret=True)
        write_control_file(files.cert, _pem(cert), secret=False)
        said.append(f"issued the front's certificate ({why}) for {', '.join(names)}")
    cert_pem = files.cert.read_text()
    shown = fingerprint(cert_pem)
    if not files.fingerprint.exists() or files.fingerprint.read_text().strip() != shown:
        write_control_file(files.fingerprint, (shown + "\n").encode(), secret=False)
    return FrontTls(
        cert=cert_pem,
        key=files.key.read_text(),
        ca_cert=files.ca_cert.read_text(),
        fingerprint=shown,
        said="; ".join(said),
    )


# ---------------------------------------------------------------------------------------------
# The run's decision: the head's installed certificate (its state read) and the control side
# ---------------------------------------------------------------------------------------------


def head_cert_path(s: Settings) -> str:
    return f"{s.knobs.config_dir}/api-front.crt"


def head_ca_path(s: Settings) -> str:
    """The pair's CA certificate on the head: its own gates verify the front with it."""
    return f"{s.knobs.config_dir}/api-ca.crt"


def tls_parts(s: Settings) -> list[Part]:
    """The state read's part of the head's installed front certificate, by digest."""
    if not s.me.is_head:
        return []
    return [Part("front_cert", SecretDigest, (("path", head_cert_path(s)),))]


def uses_pair_ca(s: Settings) -> bool:
    """The front serves HTTPS with the pair's own CA (no tls_cert of the operator's)."""
    return api_ca_file(s) is not None


def pair_tls(s: Settings, read: Callable[[Settings], Values]) -> FrontTls | None:
    """The certificate of ``s``'s head, from the run's one decision for every pair's head in the
    run (``decide_heads``: one CA, made at most once; each head its own certificate), made once
    from the heads' state reads (``read``); None when the front serves plain HTTP or the
    operator's own certificate, or that head is not in the run."""
    from pyinfra import host
    from pyinfra.context import ctx_state

    state = ctx_state.get()

    def make_decision() -> dict[str, FrontTls]:
        inventory = host.inventory
        everyone = for_inventory(inventory)
        heads = [everyone[h.name] for h in s.pair_heads or (s.head,)]
        if not uses_pair_ca(heads[0]):  # the endpoint's knobs: the same on every head
            return {}
        in_run = [h for h in heads if state.is_host_in_limit(inventory.get_host(h.me.name))]
        if not in_run:
            return {}
        ran = {h.me.name for h in in_run}
        held = any(read(h).get("front_cert", SecretDigest) for h in in_run)
        fronts = [(TlsFiles(Path(h.knobs.api_tls_dir).expanduser(), h.pair), tls_names(h))
                  for h in in_run]  # fmt: skip
        got = decide_heads(
            fronts,
            in_run[0].me.name,
            held,
            any(h.knobs.api_tls_rotate for h in heads),
            missing=tuple(h.me.name for h in heads if h.me.name not in ran),
        )
        return {h.me.name: tls for h, tls in zip(in_run, got, strict=True)}

    return once_per_run("front tls", state, make_decision).get(s.head.name)

"""The pair's own CA and the front's certificate (sparkrig/fronttls.py): made once, kept by the
next run, issued again for a new name or a near end, a lost CA refused while the head serves."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509

from sparkrig import fronttls
from sparkrig.fronttls import TlsFiles, decide

NAMES = ("localhost", "127.0.0.1", "::1", "spark-0", "192.168.1.10")


def snapshot(files: TlsFiles) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in files.dir.iterdir()}


def test_a_first_run_makes_the_ca_and_a_certificate_for_every_name(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "tls")
    got = decide(files, NAMES, "spark-0", head_holds=False, rotate=False)
    assert not got.problem
    assert "made the pair's CA" in got.said and "issued the front's certificate" in got.said
    cert = x509.load_pem_x509_certificate(got.cert.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert dns == {"localhost", "spark-0"} and ips == {"127.0.0.1", "::1", "192.168.1.10"}
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(got.ca_cert.encode()))
    for secret in (files.ca_key, files.key):  # the keys are private from their first byte
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert files.fingerprint.read_text().strip() == got.fingerprint
    assert got.fingerprint == fronttls.fingerprint(got.cert) and got.fingerprint.count(":") == 31


def test_the_next_run_keeps_everything(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "tls")
    first = decide(files, NAMES, "spark-0", head_holds=False, rotate=False)
    before = snapshot(files)
    again = decide(files, NAMES, "spark-0", head_holds=True, rotate=False)
    assert again.said == "" and again.cert == first.cert and again.key == first.key
    assert snapshot(files) == before


def test_a_new_name_issues_a_new_certificate_from_the_same_ca(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "tls")
    first = decide(files, NAMES, "spark-0", head_holds=False, rotate=False)
    got = decide(files, (*NAMES, "api.lab.example"), "spark-0", head_holds=True, rotate=False)
    assert got.cert != first.cert and got.ca_cert == first.ca_cert
    assert "lacks api.lab.example" in got.said and "made the pair's CA" not in got.said


def test_a_certificate_near_its_end_is_issued_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = TlsFiles(tmp_path / "tls")
    first = decide(files, NAMES, "spark-0", head_holds=False, rotate=False)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
        days=fronttls.CERT_DAYS - fronttls.RENEW_DAYS + 1
    )
    monkeypatch.setattr(fronttls, "_now", lambda: later)
    got = decide(files, NAMES, "spark-0", head_holds=True, rotate=False)
    assert got.cert != first.cert and "ends in" in got.said


def test_a_lost_ca_is_refused_while_the_head_serves_a_certificate(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "fresh-clone")
    got = decide(files, NAMES, "spark-0", head_holds=True, rotate=False)
    assert got.problem and "api_tls_rotate = True" in got.problem and str(files.dir) in got.problem
    assert not files.dir.exists()  # nothing made, nothing written


def test_rotate_makes_a_new_ca(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "tls")
    first = decide(files, NAMES, "spark-0", head_holds=False, rotate=False)
    got = decide(files, NAMES, "spark-0", head_holds=True, rotate=True)
    assert not got.problem and got.ca_cert != first.ca_cert and got.cert != first.cert


def test_a_certificate_of_another_ca_is_issued_again(tmp_path: Path) -> None:
    files, other = TlsFiles(tmp_path / "tls"), TlsFiles(tmp_path / "other")
    decide(files, NAMES, "spark-0", head_holds=False, rotate=False)
    decide(other, NAMES, "spark-0", head_holds=False, rotate=False)
    files.cert.write_bytes(other.cert.read_bytes())
    got = decide(files, NAMES, "spark-0", head_holds=True, rotate=False)
    assert "the pair's CA did not sign it" in got.said


def test_an_unreadable_ca_names_the_directory(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "tls")
    files.dir.mkdir()
    files.ca_key.write_text("not a key")
    files.ca_cert.write_text("not a cert")
    with pytest.raises(ValueError, match="api_tls_dir"):
        decide(files, NAMES, "spark-0", head_holds=False, rotate=False)

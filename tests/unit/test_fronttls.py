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


# ---------------------------------------------------------------------------------------------
# Several pairs behind one endpoint: one CA, each head its own certificate (decide_heads)
# ---------------------------------------------------------------------------------------------

OTHER = ("localhost", "127.0.0.1", "::1", "spark-2", "192.168.1.12")


def two_heads(tmp_path: Path) -> list[tuple[TlsFiles, tuple[str, ...]]]:
    return [
        (TlsFiles(tmp_path / "tls", "pair_a"), NAMES),
        (TlsFiles(tmp_path / "tls", "pair_b"), OTHER),
    ]


def names_of(pem: str) -> set[str]:
    cert = x509.load_pem_x509_certificate(pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return {*san.get_values_for_type(x509.DNSName), *ips}


def test_a_named_pairs_certificate_files_carry_its_name_and_the_ca_stays_shared(tmp_path: Path):
    files = TlsFiles(tmp_path / "tls", "pair_a")
    assert (files.key.name, files.cert.name, files.fingerprint.name) == (
        "front-pair_a.key", "front-pair_a.crt", "front-pair_a.sha256",
    )  # fmt: skip
    assert (files.ca_key.name, files.ca_cert.name) == ("ca.key", "ca.crt")
    assert TlsFiles(tmp_path / "tls").cert.name == "front.crt"  # one cluster: as before


def test_two_heads_get_one_ca_made_once_and_each_its_own_certificate(tmp_path: Path) -> None:
    a, b = fronttls.decide_heads(two_heads(tmp_path), "spark-0", head_holds=False, rotate=False)
    assert not a.problem and not b.problem
    assert "made the pair's CA" in a.said and "made the pair's CA" not in b.said
    assert a.ca_cert == b.ca_cert and a.cert != b.cert and a.key != b.key
    ca = x509.load_pem_x509_certificate(a.ca_cert.encode())
    for got, names in ((a, NAMES), (b, OTHER)):
        x509.load_pem_x509_certificate(got.cert.encode()).verify_directly_issued_by(ca)
        assert names_of(got.cert) == set(names)
    before = snapshot(TlsFiles(tmp_path / "tls"))
    again = fronttls.decide_heads(two_heads(tmp_path), "spark-0", head_holds=True, rotate=False)
    assert [g.said for g in again] == ["", ""] and [g.cert for g in again] == [a.cert, b.cert]
    assert snapshot(TlsFiles(tmp_path / "tls")) == before


def test_rotating_makes_one_new_ca_for_every_head(tmp_path: Path) -> None:
    first = fronttls.decide_heads(two_heads(tmp_path), "spark-0", head_holds=False, rotate=False)
    got = fronttls.decide_heads(two_heads(tmp_path), "spark-0", head_holds=True, rotate=True)
    assert got[0].ca_cert == got[1].ca_cert != first[0].ca_cert
    ca = x509.load_pem_x509_certificate(got[1].ca_cert.encode())
    x509.load_pem_x509_certificate(got[1].cert.encode()).verify_directly_issued_by(ca)


@pytest.mark.parametrize("rotate", [False, True])
def test_no_new_ca_is_made_while_a_head_is_out_of_the_run(tmp_path: Path, rotate: bool) -> None:
    fronts = two_heads(tmp_path)[:1]
    got = fronttls.decide_heads(fronts, "spark-0", False, rotate, missing=("spark-2",))
    assert "spark-2 not in the run" in got[0].problem and not got[0].cert
    assert not (tmp_path / "tls").exists()  # nothing made


def test_a_kept_ca_issues_the_heads_in_the_run_while_another_is_out_of_it(tmp_path: Path):
    fronttls.decide_heads(two_heads(tmp_path), "spark-0", head_holds=False, rotate=False)
    fronts = [(TlsFiles(tmp_path / "tls", "pair_a"), (*NAMES, "api.example"))]
    got = fronttls.decide_heads(fronts, "spark-0", True, False, missing=("spark-2",))
    assert not got[0].problem and "lacks api.example" in got[0].said

"""The API front's site file per settings (sparkrig/front.py, templates/sparkrig-api.conf.j2):
what the real-nginx tests (tests/serving/test_front_nginx.py) cannot tell apart by behaviour; the
front's files a run owns, in order, each with its operation (``wanted_files``)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import cluster

from sparkrig import front
from sparkrig.config.inventory import build
from sparkrig.fronttls import FrontTls
from sparkrig.owned import file_absent, file_present, secret_installed
from sparkrig.pairsecret import Secret


def site(**knobs: object) -> str:
    return front.site_text(build(cluster(2, **knobs))["spark-0"])


def directives(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_the_site_proxies_to_the_loopback_engine_with_streaming_intact() -> None:
    lines = directives(site())
    assert "listen 8000 ssl default_server;" in lines  # HTTPS by default
    assert "ssl_certificate /etc/sparkrig/api-front.crt;" in lines
    assert "listen 8000 default_server;" in directives(site(api_tls=False))
    assert "server 127.0.0.1:8001;" in lines
    for d in ("proxy_buffering off;", "proxy_request_buffering off;", "proxy_http_version 1.1;",
              'proxy_set_header Connection "";', "proxy_read_timeout 3600s;",
              "limit_conn sparkrig_api_perip 64;", "limit_conn_status 429;",
              "include /etc/sparkrig/api-front-key.conf;", "server_tokens off;"):  # fmt: skip
        assert d in lines, d
    assert not any(ln.startswith("map $http_origin") for ln in lines)
    assert not any(ln.startswith("ssl_") for ln in directives(site(api_tls=False)))
    assert not any("Access-Control-Allow-Origin $" in ln for ln in lines)  # no CORS


def test_knobs_reach_the_site() -> None:
    text = site(api_port=9000, engine_port=9001, api_conn_per_ip=8,
                api_cors_origins=["https://a.example", "http://b.example:3000"],
                tls_cert="c.pem", tls_key="k.pem")  # fmt: skip
    lines = directives(text)
    assert "listen 9000 ssl default_server;" in lines and "server 127.0.0.1:9001;" in lines
    assert "ssl_certificate /etc/sparkrig/api-front.crt;" in lines
    assert "ssl_certificate_key /etc/sparkrig/api-front.key;" in lines
    assert "limit_conn sparkrig_api_perip 8;" in lines
    assert '"https://a.example" "https://a.example";' in lines
    assert '"http://b.example:3000" "http://b.example:3000";' in lines
    assert "c.pem" not in text  # the control side's path never reaches the head's config


def test_api_auth_off_renders_no_key_check() -> None:
    text = site(api_auth=False)
    assert "api-front-key.conf" not in text and "$sparkrig_api_key_ok" not in text
    assert "proxy_pass http://sparkrig_engine;" in text


def test_the_key_include_is_a_case_sensitive_whole_match() -> None:
    text = front.key_include_text("ab" * 24)
    rule = re.search(r'"~\^\(\?i:bearer\) (\S+)\$" 1;', text)
    assert rule and rule.group(1) == "ab" * 24
    assert "default 0;" in text and "~*" not in text  # ~* would make the key case-insensitive


def test_the_front_files_in_order_each_with_its_operation(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nx\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\ny\n")
    s = build(cluster(2, tls_cert=str(cert), tls_key=str(key)))["spark-0"]
    known = Secret("ab" * 24, "made")
    files = front.wanted_files(s, s.knobs, known, None)
    assert [(f.dest, f.operation()[0]) for f in files] == [
        ("/etc/sparkrig/api-front-key.conf", secret_installed),
        ("/etc/sparkrig/api-front.crt", file_present),
        ("/etc/sparkrig/api-front.key", secret_installed),
        ("/etc/sparkrig/api-ca.crt", file_absent),  # the operator's: no CA of the pair's
        (front.SITE, file_present),
    ]
    assert files[0].operation()[1]["text"] == front.key_include_text("ab" * 24)
    assert files[2].operation()[1] == {"text": key.read_text(), "dest": files[2].dest}
    # the default: the pair's CA's certificate, its key a secret, the CA for the head's gates
    s = build(cluster(2))["spark-0"]
    tls = FrontTls("CERT", "KEY", "CA", "AB:CD")
    files = front.wanted_files(s, s.knobs, known, tls)
    assert [(f.dest, f.operation()) for f in files[1:4]] == [
        ("/etc/sparkrig/api-front.crt", (file_present, {"text": "CERT", "dest": files[1].dest})),
        ("/etc/sparkrig/api-front.key", (secret_installed, {"text": "KEY", "dest": files[2].dest})),
        ("/etc/sparkrig/api-ca.crt", (file_present, {"text": "CA", "dest": files[3].dest})),
    ]
    # HTTP, the head's key known by digest only: the include left alone, the TLS files removed
    s = build(cluster(2, api_tls=False))["spark-0"]
    digest_only = Secret("", "held", sha256="0" * 64, holder="spark-0")
    files = front.wanted_files(s, s.knobs, digest_only, None)
    http = "Remove the API front's TLS files while it serves HTTP"
    p = front.front_paths(s)
    site = {"text": front.site_text(s), "dest": front.SITE}
    assert [(f.name, f.operation()) for f in files] == [
        (http, (file_absent, {"path": p["tls_cert"]})),
        (http, (file_absent, {"path": p["tls_key"]})),
        (http, (file_absent, {"path": p["tls_ca"]})),
        ("Install the API front's nginx site", (file_present, site)),
    ]
    # a refused decision (a lost CA: preflight fails the head) leaves the TLS files alone
    refused = front.wanted_files(s := build(cluster(2))["spark-0"], s.knobs, known, FrontTls())
    assert [f.dest for f in refused] == ["/etc/sparkrig/api-front-key.conf", front.SITE]
    # api_auth off: the include removed
    s = build(cluster(2, api_auth=False))["spark-0"]
    off = front.wanted_files(s, s.knobs, None, None)[0]
    assert off.operation() == (file_absent, {"path": "/etc/sparkrig/api-front-key.conf"})


def test_nginx_gets_a_restart_drop_in_that_comes_back_from_a_kill_and_gives_up_on_a_loop() -> None:
    text = front.restart_dropin_text()
    lines = directives(text)
    # on-failure covers SIGKILL (an unclean signal: `systemctl kill -s KILL nginx.service`)
    assert "Restart=on-failure" in lines and "RestartSec=2" in lines
    assert lines.index("[Service]") < lines.index("Restart=on-failure")
    # a broken config is given up after 5 starts in 60 s, not restarted forever
    assert lines[:3] == ["[Unit]", "StartLimitIntervalSec=60", "StartLimitBurst=5"]
    assert front.RESTART_DROPIN == "/etc/systemd/system/nginx.service.d/sparkrig.conf"
    # owned on the head alone (the state read lists it), none on a worker
    settings = build(cluster(2))
    assert front.RESTART_DROPIN in front.front_files(settings["spark-0"])
    assert front.front_files(settings["spark-1"]) == []


def test_preflight_warns_when_the_key_would_cross_the_lan_in_clear(tmp_path) -> None:
    from sparkrig.preflight import in_clear

    assert in_clear(build(cluster(2))["spark-0"]) is None  # the defaults: HTTPS, the pair's CA
    said = in_clear(build(cluster(2, api_tls=False))["spark-0"])  # plain HTTP to private ranges
    assert said is not None and "the API key, every prompt and every answer" in said
    assert "192.168.0.0/16" in said and "set api_tls = True" in said
    loopback = ["127.0.0.0/8", "::1/128"]
    assert in_clear(build(cluster(2, api_tls=False, api_allow=loopback))["spark-0"]) is None
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("cert")
    key.write_text("key")
    assert in_clear(build(cluster(2, tls_cert=str(cert), tls_key=str(key)))["spark-0"]) is None

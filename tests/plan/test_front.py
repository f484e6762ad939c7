"""The API front in the plan (tasks/front.py, docs/front.md): a bare head gets nginx, its restart
drop-in, the site and the key include, the config checked before a reload; a converged head does
nothing; a head lacking the drop-in gets it and a systemd reload, no nginx restart; a rotated key
reaches the include and reloads nginx; no --dry --diff output carries the key; a head missing the
include whose key the control side has no copy of is refused alone, naming api_key_file."""

from __future__ import annotations

from tests.plan import fakehosts
from tests.plan.fakehosts import ROOT
from tests.plan.harness import run
from tests.plan.test_plan import ACTION, HEAD, WORKER, apply, converge_state

SITE = "/etc/nginx/conf.d/sparkrig-api.conf"
INCLUDE = "/etc/sparkrig/api-front-key.conf"
HELD = open("tests/plan/api-key").read().strip()
DROPIN = "/etc/systemd/system/nginx.service.d/sparkrig.conf"
CHECK, RELOAD = "nginx -t -q", "systemctl reload nginx.service"
TLS_CERT, TLS_KEY = "/etc/sparkrig/api-front.crt", "/etc/sparkrig/api-front.key"
TLS_CA = "/etc/sparkrig/api-ca.crt"


def test_a_bare_head_gets_nginx_and_the_front_and_the_key_never_shows(monkeypatch):
    r = run(["--dry", "--diff", "tests/plan/inventory_state.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"Will create {SITE}" in r.output
    assert "+     server 127.0.0.1:8001;" in r.output  # the site diffed in full
    assert f"Will write {INCLUDE} (secret: content not shown)" in r.output
    assert f"Will create {DROPIN}" in r.output and "+ StartLimitBurst=5" in r.output
    assert HELD not in r.output
    # HTTPS by default: the pair's CA's certificate, the key a secret, the CA for the head's gates
    assert "+     listen 8000 ssl default_server;" in r.output
    assert f"Will write {TLS_KEY} (secret: content not shown)" in r.output
    assert f"Will create {TLS_CA}" in r.output and f"Will create {TLS_CERT}" in r.output
    tls_key = (ROOT / fakehosts.TLS_DIR / "front.key").read_text()
    assert tls_key.splitlines()[1] not in r.output
    front = [op for op in r.changed_ops[HEAD] if op.startswith("tasks/front.py")]
    assert front == [
        "tasks/front.py | Install nginx for the API front",
        "tasks/front.py | Restart the API front when it dies (nginx.service drop-in)",
        "tasks/front.py | Reload systemd after the API front's drop-in changed",
        "tasks/front.py | Install the API front's key include",
        "tasks/front.py | Install the API front's TLS certificate",
        "tasks/front.py | Install the API front's TLS key",
        "tasks/front.py | Install the pair's CA for the head's own gates",
        "tasks/front.py | Install the API front's nginx site",
        "tasks/front.py | Check the whole nginx config before the front reloads",
        "tasks/front.py | Run the API front",
    ], front
    assert not [op for op in r.changed_ops.get(WORKER, []) if op.startswith("tasks/front.py")]


def test_a_converged_front_does_nothing(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert not [op for ops in r.changed_ops.values() for op in ops if "front" in op]
    assert CHECK not in r.commands[HEAD] and RELOAD not in r.commands[HEAD]


def test_a_changed_site_is_checked_then_reloaded_never_restarting_the_pair(monkeypatch):
    converge_state()
    fakehosts.inject(
        "spark-a",
        {fakehosts.owned_of(SITE): "file 644 root root " + "0" * 64},
    )
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    assert r.uploads[HEAD][SITE].startswith(b"# sparkrig's API front on @fake/spark-a")
    assert head.index(CHECK) < head.index(RELOAD)
    assert "systemctl stop sparkrig-head.service" not in head


def test_a_head_lacking_the_restart_drop_in_gets_it_then_a_systemd_reload_not_an_nginx_one(
    monkeypatch,
):
    converge_state()
    fakehosts.inject("spark-a", {fakehosts.owned_of(DROPIN): ""})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    text = r.uploads[HEAD][DROPIN].decode()
    assert "Restart=on-failure" in text and "RestartSec=2" in text
    made = head.index("mkdir -p /etc/systemd/system/nginx.service.d")
    assert made < head.index("systemctl daemon-reload")
    # effective from systemd's reload: the running front is neither reloaded nor restarted
    assert CHECK not in head and RELOAD not in head
    assert not [c for c in head if c.startswith("systemctl restart")], head
    assert "systemctl stop sparkrig-head.service" not in head
    assert DROPIN not in r.uploads.get(WORKER, {})  # a worker has no front
    assert not [c for c in r.commands[WORKER] if ACTION.search(c)]


def test_a_rotated_key_reaches_the_front_and_no_output(monkeypatch, tmp_path):
    converge_state()
    path = tmp_path / "api-key"
    path.write_text(HELD + "\n")
    r = apply(monkeypatch, "--data", f"api_key_file={path}", "--data", "api_key_rotate=True")
    assert r.exit_code == 0, r.output
    new = path.read_text().strip()
    assert new != HELD
    include = r.uploads[HEAD][INCLUDE].decode()
    assert f'"~^(?i:bearer) {new}$" 1;' in include
    head = r.commands[HEAD]
    assert head.index(CHECK) < head.index(RELOAD)
    assert new not in r.output and not [c for c in head if new in c]


def test_a_head_missing_the_include_whose_key_the_control_side_lacks_fails_alone(
    monkeypatch, tmp_path
):
    converge_state()
    # no include on the head (e.g. a head from before the front), no copy of its key here
    fakehosts.inject("spark-a", {fakehosts.owned_of(INCLUDE): ""})
    none = tmp_path / "none"
    r = apply(monkeypatch, "--data", f"api_key_file={none}")
    assert r.exit_code != 0, r.output
    failed = [line for line in r.output.splitlines() if "key include" in line]
    assert failed and all(HEAD in line for line in failed), r.output
    assert f"{INCLUDE} is missing" in r.output and f"api_key_file ({none})" in r.output
    assert "sudo cat /etc/sparkrig/api-key" in r.output and "api_key_rotate = True" in r.output
    assert HEAD not in r.uploads and not [c for c in r.commands[HEAD] if ACTION.search(c)]
    assert f"[{HEAD}] failed" in r.output and f"[{WORKER}] failed" not in r.output
    assert HELD not in r.output


def test_a_control_machine_without_the_pairs_ca_is_refused_while_the_head_serves_one(
    monkeypatch, tmp_path
):
    converge_state()  # the head serves a certificate of the pair's CA
    fresh = tmp_path / "fresh-clone-tls"
    r = apply(monkeypatch, "--data", f"api_tls_dir={fresh}")
    assert r.exit_code != 0, r.output
    assert f"{fresh}/ca.key is missing" in r.output and "api_tls_rotate = True" in r.output
    assert not fresh.exists()  # no new CA behind the clients' backs
    assert HEAD not in r.uploads and not [c for c in r.commands[HEAD] if ACTION.search(c)]
    assert f"[{WORKER}] failed" not in r.output


def test_rotating_the_ca_issues_a_new_certificate_and_reloads_the_front(monkeypatch, tmp_path):
    converge_state()
    fresh = tmp_path / "rotated-tls"
    r = apply(monkeypatch, "--data", f"api_tls_dir={fresh}", "--data", "api_tls_rotate=True")
    assert r.exit_code == 0, r.output
    assert r.uploads[HEAD][TLS_CERT] == (fresh / "front.crt").read_bytes()
    assert r.uploads[HEAD][TLS_CA] == (fresh / "ca.crt").read_bytes()
    head = r.commands[HEAD]
    assert head.index(CHECK) < head.index(RELOAD)
    assert "systemctl stop sparkrig-head.service" not in head  # the engine is not the front's
    assert (fresh / "front.key").read_text().splitlines()[1] not in r.output


def test_api_tls_off_serves_http_and_removes_the_tls_files(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "api_tls=False")
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    assert "listen 8000 default_server;" in r.uploads[HEAD][SITE].decode()
    for path in (TLS_CERT, TLS_KEY, TLS_CA):
        assert any(c.startswith("rm") and path in c for c in head), (path, head)

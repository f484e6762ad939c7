"""Secrets never cross a file another user can read and never reach the output (issue 35 item 5):
written by one command fed on stdin, judged by digest in the state read, read back only at apply
time and unprinted, even at -vvv."""

from __future__ import annotations

import re

from sparkrig.secretio import INSTALL_SCRIPT, Held, digest, install_command
from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import HEAD, INVENTORY, WORKER, apply, converge_state, gated_locks

PAIR_TOKEN, HUB_TOKEN = "/etc/sparkrig/pair-token", "/etc/sparkrig/hf-token"
API_KEY, API_ENV = "/etc/sparkrig/api-key", "/etc/sparkrig/api-key.env"
HUB = "hf_" + "s3cret" * 6


def secrets() -> list[str]:
    return [
        HUB,
        open("tests/plan/pair-token").read().strip(),
        open("tests/plan/api-key").read().strip(),
    ]


def assert_nowhere(r, values: list[str]) -> None:
    for secret in values:
        assert secret not in r.output
        assert not [c for cmds in r.commands.values() for c in cmds if secret in c]


def test_the_install_command_holds_only_the_digest_and_feeds_the_secret_on_stdin():
    cmd = install_command("s3cret-value\n", PAIR_TOKEN)
    line = cmd.get_raw_value()
    assert "s3cret-value" not in line
    assert digest("s3cret-value\n") in line
    assert cmd.connector_arguments["_stdin"] == "s3cret-value\n"
    assert "umask 077" in INSTALL_SCRIPT and "install -m 600" in INSTALL_SCRIPT
    assert 'rm -f "$t"' in INSTALL_SCRIPT  # nothing left behind on a failure


def test_no_secret_in_dry_diff_or_apply_output_even_at_vvv(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", HUB)
    gated = gated_locks(tmp_path)
    for args in (["--dry", "--diff", "-vvv"], ["-y", "--diff", "-vvv"]):
        r = run([*args, *gated, INVENTORY, "deploy.py"], monkeypatch)
        assert r.exit_code == 0, r.output
        assert_nowhere(r, secrets())
    # the secrets went through stdin, to their destinations, as 0600 files written under umask 077
    assert r.uploads[HEAD][HUB_TOKEN] == (HUB + "\n").encode()
    assert r.uploads[WORKER][PAIR_TOKEN].decode().strip() == secrets()[1]
    for name in (HEAD, WORKER):
        for command, fed in r.stdin[name]:
            assert command.startswith("sh -c 'umask 077") and fed not in command


def test_no_upload_ever_carries_a_secret(monkeypatch, tmp_path):
    """pyinfra's upload path (a /tmp/pyinfra-<sha1> file as the SSH user) is never used for one."""
    monkeypatch.setenv("HF_TOKEN", HUB)
    r = apply(monkeypatch, *gated_locks(tmp_path))
    assert r.exit_code == 0, r.output
    stdin_dests = {c.split()[-2] for cmds in r.stdin.values() for c, _ in cmds}
    assert {PAIR_TOKEN, HUB_TOKEN, API_KEY, API_ENV} <= stdin_dests
    uploaded = [c for cmds in r.commands.values() for c in cmds if "pyinfra-" in c]
    assert not [c for c in uploaded if any(s in c for s in stdin_dests)]


def test_the_state_read_carries_digests_never_a_secret(monkeypatch):
    converge_state()
    r = run(["--dry", "-vvv", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert_nowhere(r, secrets()[1:])
    reads = [c for cmds in r.commands.values() for c in cmds if "##SPARKRIG-PART" in c]
    assert reads, "no state read"
    for path in (PAIR_TOKEN, API_KEY):
        assert f"cat {path}" not in "\n".join(reads)  # no part reads a secret back
        assert f"sha256sum < {path}" in "\n".join(reads)
    # --dry never reads a secret, not even unprinted
    assert not [c for cmds in r.commands.values() for c in cmds if fakehosts.SECRET_READ.match(c)]


def test_a_rank_lacking_the_pairs_secret_gets_a_copy_at_apply_time_unprinted(monkeypatch, tmp_path):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.PAIR_SECRET: fakehosts.held("")})
    fakehosts.inject("spark-b", {fakehosts.owned_of(PAIR_TOKEN): ""})
    args = ["--data", f"pair_token_file={tmp_path / 'none'}"]
    dry = run(["--dry", "-vvv", *args, INVENTORY, "deploy.py"], monkeypatch)
    assert dry.exit_code == 0, dry.output
    assert not [c for cmds in dry.commands.values() for c in cmds if c == f"cat {PAIR_TOKEN}"]
    r = run(["-y", "-vvv", *args, INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"cat {PAIR_TOKEN}" in r.commands[HEAD]  # read on the holder, at apply time
    assert r.uploads[WORKER][PAIR_TOKEN].decode().strip() == secrets()[1]
    assert_nowhere(r, secrets()[1:2])


def test_a_head_with_a_key_but_no_env_file_and_no_control_copy_is_refused(monkeypatch, tmp_path):
    converge_state()
    fakehosts.inject("spark-a", {fakehosts.API_KEY_ENV: fakehosts.held("")})
    r = apply(monkeypatch, "--data", f"api_key_file={tmp_path / 'none'}")
    assert r.exit_code != 0
    assert f"its env file for vLLM ({API_ENV}) is gone" in r.output
    assert "api_key_rotate = True" in r.output and f"sudo cat {API_KEY}" in r.output
    assert r.uploads == {}
    assert_nowhere(r, secrets()[2:])


def test_the_hub_token_rests_on_the_head_only_during_a_gated_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", HUB)
    public = apply(monkeypatch)  # the test lockfiles' repos are public: no token at all
    assert public.exit_code == 0, public.output
    assert not [c for c in public.commands[HEAD] if HUB_TOKEN in c and "SPARKRIG-PART" not in c]
    gated = gated_locks(tmp_path)
    r = apply(monkeypatch, *gated)  # bare hosts: the head fetches a gated repo
    assert r.exit_code == 0, r.output
    head = r.commands[HEAD]
    wrote = next(i for i, c in enumerate(head) if f" {HUB_TOKEN} " in c and "umask 077" in c)
    fetch = next(i for i, c in enumerate(head) if "--token-file" in c)
    assert wrote < fetch < head.index(f"rm -f {HUB_TOKEN}")
    assert HUB_TOKEN not in r.uploads.get(WORKER, {})
    converge_state()  # the weights are there: no fetch, no token
    again = apply(monkeypatch, *gated)
    assert again.exit_code == 0, again.output
    assert not [c for c in again.commands[HEAD] if HUB_TOKEN in c and "SPARKRIG-PART" not in c]


def test_the_digest_fact_reads_sha_and_length_only():
    from sparkrig.secretio import SecretDigest

    fact = SecretDigest()
    cmd = fact.command(PAIR_TOKEN).get_raw_value()
    assert "cat " not in cmd and "sha256sum" in cmd
    h = Held.of("x" * 40)
    assert fact.process([h.sha256, "40", "##SPARKRIG-END##"]) == h
    assert fact.process(["##SPARKRIG-END##"]) == Held()
    assert re.fullmatch(r"[0-9a-f]{64}", h.sha256)

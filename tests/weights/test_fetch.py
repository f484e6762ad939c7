"""The fetcher against fakehub on loopback: redirect to the CDN, resume after kill -9, corruption
on the server and on disk, token handling, stamps/quick verify, state, serve + copy."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import FETCH, Hub, lock_files, parts_in_flight, poll, run_fetch
from .topo import fetch_argv, serve_argv

BIG = "model-00001-of-00004.safetensors"  # 4 MiB, fetched first (largest, then by path)
MID = "model-00003-of-00004.safetensors"  # 2 MiB


def fetch_args(lock: Path, dest: Path, hub: Hub, *extra: str) -> list[str]:
    return fetch_argv(lock, dest, hub.url, "--progress-interval", "0.2", "--backoff", "0.1", *extra)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def assert_complete(lock: Path, dest: Path) -> None:
    for f in lock_files(lock):
        p = dest / f["path"]
        assert p.stat().st_size == f["size"], f["path"]
        if "sha256" in f:
            assert sha256(p) == f["sha256"], f["path"]
        assert not Path(str(p) + ".part").exists()


def body_requests(hub: Hub, sha: str) -> list[dict[str, object]]:
    return [r for r in hub.log() if r["path"].endswith(sha) and r["method"] == "GET"]


def test_full_fetch_via_cdn_redirect(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    r = run_fetch(*fetch_args(model_lock, dest, hub))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_complete(model_lock, dest)
    log = hub.log()
    assert {x["origin"] for x in log} == {"hub", "cdn"}
    lfs = [f for f in lock_files(model_lock) if "sha256" in f]
    assert sum(1 for x in log if x["origin"] == "cdn") == len(lfs)
    status = json.loads((tmp_path / "m.fetch-status.json").read_text())
    assert status["state"] == "done" and status["files_done"] == status["files_total"] == 8
    assert "progress done" in r.stdout
    # a re-run trusts the stamps and downloads nothing
    hub.clear()
    r2 = run_fetch(*fetch_args(model_lock, dest, hub))
    assert r2.returncode == 0 and hub.log() == []
    assert "8/8 verified" in r2.stdout


def test_kill9_then_resume_refetches_at_most_a_chunk(
    hub: Hub, model_lock: Path, tmp_path: Path
) -> None:
    f = next(x for x in lock_files(model_lock) if x["path"] == BIG)
    hub.fault(path=BIG, throttle_bps=1_000_000)
    dest = tmp_path / "m"
    p = subprocess.Popen(
        [sys.executable, FETCH, *fetch_args(model_lock, dest, hub)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    part = dest / (BIG + ".part")
    deadline = time.time() + 20
    while time.time() < deadline and (not part.exists() or part.stat().st_size < 1_500_000):
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    have = part.stat().st_size
    assert 1_000_000 < have < f["size"]
    deadline = time.time() + 10  # the server logs the killed request when its write fails
    while time.time() < deadline and not body_requests(hub, f["sha256"]):
        time.sleep(0.05)
    served_before = sum(int(x["sent"]) for x in body_requests(hub, f["sha256"]))
    hub.clear()
    r = run_fetch(*fetch_args(model_lock, dest, hub))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_complete(model_lock, dest)
    again = body_requests(hub, f["sha256"])
    assert [x["range"] for x in again] == [f"bytes={have}-"]
    assert again[0]["status"] == 206 and again[0]["sent"] == f["size"] - have
    # the resume starts exactly where the .part ends: every byte the client had read reached
    # the .part (unbuffered writes per chunk); only bytes still in flight in socket buffers
    # when the process died are sent twice
    assert served_before >= have


def test_drop_mid_file_resumes_from_exact_offset(
    hub: Hub, model_lock: Path, tmp_path: Path
) -> None:
    f = next(x for x in lock_files(model_lock) if x["path"] == MID)
    hub.fault(path=MID, drop_after=1_234_567, times=1)
    r = run_fetch(*fetch_args(model_lock, tmp_path / "m", hub))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_complete(model_lock, tmp_path / "m")
    reqs = body_requests(hub, f["sha256"])
    assert [x["range"] for x in reqs] == [None, "bytes=1234567-"]
    assert sum(int(x["sent"]) for x in reqs) == f["size"]


def test_server_corruption_never_promoted(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    hub.fault(path=MID, corrupt_offset=777)
    dest = tmp_path / "m"
    r = run_fetch(*fetch_args(model_lock, dest, hub, "--max-verify-failures", "2"))
    assert r.returncode == 1
    assert not (dest / MID).exists() and not (dest / (MID + ".part")).exists()
    assert f"FAILED {MID}" in r.stdout
    status = json.loads((tmp_path / "m.fetch-status.json").read_text())
    assert status["state"] == "failed" and [x["path"] for x in status["failed"]] == [MID]
    others = [x for x in lock_files(model_lock) if x["path"] != MID]
    assert all((dest / x["path"]).exists() for x in others)
    st = json.loads(run_fetch("state", "--lock", str(model_lock), "--dest", str(dest)).stdout)
    assert st["missing"] == 1 and st["verified"] == 7 and st["files_to_fetch"] == 1
    # a transient corruption is retried and then succeeds
    hub.clear()
    hub.fault(path=MID, corrupt_offset=777, times=1)
    r = run_fetch(*fetch_args(model_lock, dest, hub))
    assert r.returncode == 0, r.stdout
    assert_complete(model_lock, dest)
    assert len([x for x in hub.log() if x["origin"] == "cdn"]) == 2


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).read()
        return True
    except OSError:
        return False


def status_pid(status: Path) -> int | None:
    try:
        return int(json.loads(status.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not written yet, or mid-write


def test_disk_corruption_refetched(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    assert run_fetch(*fetch_args(model_lock, dest, hub)).returncode == 0
    target = dest / MID
    st = target.stat()
    time.sleep(0.01)
    with open(target, "r+b") as fh:  # flip one byte in place, then put the mtime back
        fh.seek(4242)
        b = fh.read(1)
        fh.seek(4242)
        fh.write(bytes([b[0] ^ 1]))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    base = ["--lock", str(model_lock), "--dest", str(dest)]
    q = run_fetch("verify", *base, "--mode", "quick")
    assert q.returncode == 1 and MID in json.loads(q.stdout)["mismatched"]  # ctime changed
    full = run_fetch("verify", *base, "--mode", "full")
    assert full.returncode == 1 and json.loads(full.stdout)["mismatched"] == [MID]
    hub.clear()
    r = run_fetch(*fetch_args(model_lock, dest, hub))
    assert r.returncode == 0 and "removed, will re-fetch" in r.stdout
    assert_complete(model_lock, dest)
    assert len([x for x in hub.log() if x["origin"] == "cdn"]) == 1
    assert run_fetch("verify", *base, "--mode", "full").returncode == 0


def test_stale_stamp_forged_is_caught_by_full_only(
    hub: Hub, model_lock: Path, tmp_path: Path
) -> None:
    """Quick trusts a stamp whose stat fields match; full re-hashes. Forge that case."""
    dest = tmp_path / "m"
    assert run_fetch(*fetch_args(model_lock, dest, hub)).returncode == 0
    target = dest / MID
    with open(target, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\0\1\2")
    stamps_path = tmp_path / "m.stamps.json"
    db = json.loads(stamps_path.read_text())
    st = target.stat()
    db["files"][MID].update(mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    stamps_path.write_text(json.dumps(db))
    base = ["--lock", str(model_lock), "--dest", str(dest)]
    assert run_fetch("verify", *base, "--mode", "quick").returncode == 0
    assert run_fetch("verify", *base, "--mode", "full").returncode == 1
    hub.clear()
    r = run_fetch(*fetch_args(model_lock, dest, hub, "--verify", "full"))
    assert r.returncode == 0
    assert_complete(model_lock, dest)


def test_bad_part_files(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    files = {x["path"]: x for x in lock_files(model_lock)}
    # larger than expected: discarded
    (dest / (BIG + ".part")).write_bytes(b"x" * (files[BIG]["size"] + 10))
    # garbage prefix: resumed, fails verification, deleted, fetched again from 0
    (dest / (MID + ".part")).write_bytes(b"\0" * 300_000)
    # correct prefix, but the server ignores Range (200): truncated and restarted
    other = "model-00004-of-00004.safetensors"
    (dest / (other + ".part")).write_bytes(b"junk" * 1000)
    hub.fault(path=other, ignore_range=True)
    r = run_fetch(*fetch_args(model_lock, dest, hub))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_complete(model_lock, dest)
    assert ".part larger than expected" in r.stdout
    assert "server ignored Range (200)" in r.stdout
    mid_reqs = body_requests(hub, files[MID]["sha256"])
    assert [x["range"] for x in mid_reqs] == ["bytes=300000-", None]


def test_token_only_to_hub_and_never_shown(
    hub_root: Path, model_lock: Path, tmp_path: Path
) -> None:
    token = "hf_TOPsecretTOKEN0987654321"
    h = Hub(hub_root, token=token)
    tok = tmp_path / "tok"
    tok.write_text(token)
    os.chmod(tok, 0o600)
    dest = tmp_path / "m"
    try:
        h.fault(path=BIG, throttle_bps=4_000_000)
        p = subprocess.Popen(
            [sys.executable, FETCH, *fetch_args(model_lock, dest, h, "--token-file", str(tok))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        poll(lambda: bool(parts_in_flight(dest)), "the fetch under way")
        cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{p.pid}/environ").read_bytes()
        out, err = p.communicate(timeout=60)
        log = h.log()
        bad = run_fetch(*fetch_args(model_lock, tmp_path / "n", h))  # no token: 401
    finally:
        h.close()
    assert p.returncode == 0, out + err
    assert token.encode() not in cmdline + environ
    for text in (
        out,
        err,
        (tmp_path / "m.fetch-status.json").read_text(),
        (tmp_path / "m.stamps.json").read_text(),
        bad.stdout,
        bad.stderr,
    ):
        assert token not in text
    hub_reqs = [x for x in log if x["origin"] == "hub"]
    cdn_reqs = [x for x in log if x["origin"] == "cdn"]
    assert hub_reqs and all(x["auth"] for x in hub_reqs)
    assert cdn_reqs and not any(x["auth"] for x in cdn_reqs)
    assert bad.returncode == 1 and "HTTP 401" in bad.stdout


def test_state_counts(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    assert run_fetch(*fetch_args(model_lock, dest, hub)).returncode == 0
    files = {x["path"]: x for x in lock_files(model_lock)}
    (dest / BIG).unlink()  # missing
    (dest / MID).rename(dest / (MID + ".part"))  # partial (complete .part, never renamed)
    with open(dest / "model-00004-of-00004.safetensors", "ab") as fh:  # wrong size
        fh.write(b"x")
    p = dest / "model-00002-of-00004.safetensors"  # right size, new inode: unverified
    data = p.read_bytes()
    p.unlink()
    p.write_bytes(data)
    out = run_fetch("state", "--lock", str(model_lock), "--dest", str(dest))
    assert out.returncode == 0
    st = json.loads(out.stdout)
    assert (st["verified"], st["missing"], st["partial"], st["mismatched"], st["unverified"]) == (
        4,
        1,
        1,
        1,
        1,
    )
    assert st["files_to_fetch"] == 4 and st["total_files"] == 8
    sizes = files[BIG]["size"] + 0 + files["model-00004-of-00004.safetensors"]["size"]
    assert st["bytes_to_fetch"] == sizes + len(data)
    assert st["fetch"]["state"] == "done"
    hub.clear()
    r = run_fetch(*fetch_args(model_lock, dest, hub))
    assert r.returncode == 0
    assert_complete(model_lock, dest)
    # the unverified file was hashed and kept; the complete .part was verified without a request
    fetched = {x["path"].rsplit("/", 1)[-1] for x in hub.log() if x["origin"] == "cdn"}
    assert fetched == {files[BIG]["sha256"], files["model-00004-of-00004.safetensors"]["sha256"]}
    # state never fails the host
    bad = run_fetch("state", "--lock", str(tmp_path / "nope.json"), "--dest", str(dest))
    assert bad.returncode == 0 and json.loads(bad.stdout)["ok"] is False


def test_quick_verify_many_files_is_fast(tmp_path: Path) -> None:
    dest = tmp_path / "many"
    dest.mkdir()
    files = []
    for i in range(3000):
        data = b"%d" % i * 7
        (dest / f"f{i:05d}.bin").write_bytes(data)
        files.append(
            {"path": f"f{i:05d}.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
    lock = tmp_path / "many.lock.json"
    lock.write_text(json.dumps({"version": 1, "repo": "a/b", "commit": "0" * 40, "files": files}))
    base = ["verify", "--lock", str(lock), "--dest", str(dest)]
    first = json.loads(run_fetch(*base, "--mode", "quick").stdout)
    assert first["verified"] == 3000 and first["hashed_bytes"] > 0
    second = json.loads(run_fetch(*base, "--mode", "quick").stdout)
    assert second["verified"] == 3000 and second["hashed_bytes"] == 0  # stamps, no re-hash
    full = json.loads(run_fetch(*base, "--mode", "full").stdout)
    assert full["hashed_bytes"] == sum(f["size"] for f in files)


def test_serve_and_one_lane_copy(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    assert run_fetch(*fetch_args(model_lock, src, hub)).returncode == 0
    (src / (BIG + ".part")).write_bytes(b"p")
    (src / ".hidden").write_bytes(b"h")
    (src / "notinlock.txt").write_bytes(b"n")
    (src / "model.stamps.json").write_bytes(b"{}")
    (src / "model.fetch-status.json").write_bytes(b"{}")
    port = 18000 + os.getpid() % 1000
    srv = subprocess.Popen(
        # two addresses, as a ring's head serves each worker's way in
        [sys.executable, FETCH, *serve_argv(src, f"127.0.0.1:{port},127.0.0.2:{port}", model_lock)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}/"
        poll(lambda: answers(base + "config.json"), "sparkrig-fetch serve answering")
        second = f"http://127.0.0.2:{port}/config.json"
        poll(lambda: answers(second), "sparkrig-fetch serve answering on its second address")
        for bad in (
            BIG + ".part",
            ".hidden",
            "notinlock.txt",
            "../src/config.json",
            "%2e%2e/src/config.json",
        ):
            with pytest.raises(urllib.error.HTTPError) as ei:
                urllib.request.urlopen(base + bad, timeout=5)
            assert ei.value.code == 404, bad
        req = urllib.request.Request(base + BIG, headers={"Range": "bytes=100-199"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 206 and resp.read() == (src / BIG).read_bytes()[100:200]
        dst = tmp_path / "dst"
        r = run_fetch(
            "fetch",
            "--lock",
            str(model_lock),
            "--dest",
            str(dst),
            "--base-url",
            base,
            "--progress-interval",
            "0.2",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert_complete(model_lock, dst)
    finally:
        srv.terminate()
        srv.wait(10)


def test_follow_reports_progress_and_outcome(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    status = tmp_path / "m.fetch-status.json"
    # a previous run's "done" must not be taken for this run's: the fetch writes its own
    # status (with its pid) before anything else
    status.write_text(
        json.dumps(
            {
                "state": "done",
                "pid": 1,
                "bytes_done": 0,
                "bytes_total": 0,
                "files_done": 0,
                "files_total": 0,
                "rate": 0,
                "lanes": {},
            }
        )
    )
    # one file held back until follow has shown the fetch in flight: load cannot let it finish first
    held = threading.Event()
    hub.fault(path=MID, hold=held)
    timer = threading.Timer(60, held.set)  # a follow that prints nothing meanwhile fails, not hangs
    timer.daemon = True
    timer.start()
    p = subprocess.Popen(
        [sys.executable, FETCH, *fetch_args(model_lock, dest, hub)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        poll(lambda: status_pid(status) == p.pid, "the fetch's status file naming its pid")
        f = subprocess.Popen(
            [sys.executable, FETCH, "follow", "--status", str(status), "--interval", "0.1"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert f.stdout is not None
        first = f.stdout.readline()
        assert first.startswith("progress") and not first.startswith("progress done"), first
    finally:
        held.set()
    rest, _ = f.communicate(timeout=60)
    p.wait(30)
    assert f.returncode == 0, first + rest
    lines = [x for x in (first + rest).splitlines() if x.startswith("progress")]
    assert len(lines) >= 2 and lines[-1].startswith("progress done")
    assert "files 8/8" in lines[-1] and "GiB" in lines[-1] and "eta" in lines[-1]
    # a failed run: follow exits 1 and names the file
    hub.clear()
    hub.fault(path=MID, corrupt_offset=5)
    (dest / MID).unlink()
    assert run_fetch(*fetch_args(model_lock, dest, hub)).returncode == 1
    f = run_fetch("follow", "--status", str(status), "--interval", "0.1", timeout=30)
    assert f.returncode == 1 and f"FAILED {MID}" in f.stdout
    # a dead fetch that never finished: follow does not wait forever
    st = json.loads(status.read_text())
    status.write_text(json.dumps(dict(st, state="running", pid=p.pid)))  # p has exited
    f = run_fetch("follow", "--status", str(status), "--interval", "0.1", timeout=30)
    assert f.returncode == 1 and "not running" in f.stdout


def test_one_fetch_at_a_time(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    hub.fault(path="*", throttle_bps=4_000_000)
    p = subprocess.Popen(
        [sys.executable, FETCH, *fetch_args(model_lock, dest, hub)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        poll(lambda: bool(parts_in_flight(dest)), "the first fetch under way")
        second = run_fetch(*fetch_args(model_lock, dest, hub))
        assert second.returncode == 1 and "another fetch is running" in second.stderr
    finally:
        assert p.wait(60) == 0
    assert_complete(model_lock, dest)


def test_not_enough_space_fails_early(hub: Hub, model_lock: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        r = run_fetch(*fetch_args(model_lock, mnt / "m", hub))
        assert r.returncode == 1 and "not enough space" in r.stdout
        assert hub.log() == []  # nothing was downloaded
        st = json.loads((mnt / "m.fetch-status.json").read_text())
        assert st["state"] == "failed"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    r = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", key, "-out", cert, "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {r.stderr}")
    return cert, key


def test_https_with_redirect_and_token(
    hub_root: Path, model_lock: Path, tmp_path: Path, tls_cert: tuple[str, str]
) -> None:
    """The real Hub is HTTPS: certificate checked (SNI, hostname), token only to the hub."""
    token = "hf_TLStokenVALUEabcdef"
    tok = tmp_path / "tok"
    tok.write_text(token)
    os.chmod(tok, 0o600)
    h = Hub(hub_root, token=token, tls=tls_cert)
    try:
        env = dict(os.environ, SSL_CERT_FILE=tls_cert[0])
        args = fetch_args(model_lock, tmp_path / "m", h, "--token-file", str(tok))
        r = run_fetch(*args, env=env)
        log = h.log()
        # without trusting the certificate nothing is fetched
        h.clear()
        env_untrusted = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
        bad = run_fetch(
            *fetch_args(model_lock, tmp_path / "n", h, "--lane-failures", "1"), env=env_untrusted
        )
    finally:
        h.close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert_complete(model_lock, tmp_path / "m")
    assert {x["origin"] for x in log} == {"hub", "cdn"}
    assert all(x["auth"] for x in log if x["origin"] == "hub")
    assert not any(x["auth"] for x in log if x["origin"] == "cdn")
    assert token not in r.stdout + r.stderr
    assert bad.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in bad.stdout
    assert not list((tmp_path / "n").glob("*.safetensors"))


def test_follow_unit_waits_for_the_units_own_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --unit, a status whose pid is not the unit's MainPID is a previous run's: follow
    keeps waiting (here: until the unit's own status says done)."""
    from sparkhost import follow as mod

    status = tmp_path / "s.json"
    base = {"bytes_done": 1, "bytes_total": 2, "files_done": 1, "files_total": 2, "rate": 0,
            "lanes": {}, "eta_s": None}  # fmt: skip
    status.write_text(json.dumps(dict(base, state="failed", pid=111, failed=[])))
    polls = {"n": 0}

    def main_pid(unit: str) -> int:
        polls["n"] += 1
        if polls["n"] == 3:  # the new run writes its own status
            status.write_text(json.dumps(dict(base, state="done", pid=222, bytes_done=2)))
        return 222

    monkeypatch.setattr(mod, "unit_main_pid", main_pid)
    monkeypatch.setattr(mod, "unit_active", lambda unit: True)
    rc = mod.main(["--status", str(status), "--unit", "u", "--interval", "0.01"])
    out = capsys.readouterr().out
    assert rc == 0 and polls["n"] >= 3
    assert "FAILED" not in out and out.strip().splitlines()[-1].startswith("progress done")
    # the unit is gone and never wrote a status of its own: follow gives up, exit 1
    status.write_text(json.dumps(dict(base, state="running", pid=111)))
    monkeypatch.setattr(mod, "unit_main_pid", lambda unit: 0)
    monkeypatch.setattr(mod, "unit_active", lambda unit: False)
    rc = mod.main(["--status", str(status), "--unit", "u", "--interval", "0.01"])
    assert rc == 1 and "not running" in capsys.readouterr().out


def test_broken_lane_retires_other_lane_finishes(
    hub: Hub, model_lock: Path, tmp_path: Path
) -> None:
    """A lane that cannot even bind (its source address is not on this host) fails at once;
    after --lane-failures in a row it retires and the working lane fetches everything."""
    hub.fault(path="*", throttle_bps=6_000_000)
    dest = tmp_path / "m"
    r = run_fetch(*fetch_args(model_lock, dest, hub, "--uplink", "default",
                              "--uplink", "lo=192.0.2.77", "--lane-failures", "2"))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert_complete(model_lock, dest)
    st = json.loads((tmp_path / "m.fetch-status.json").read_text())
    assert st["lanes"]["lo"]["state"] == "retired" and st["lanes"]["lo"]["files"] == 0
    assert st["lanes"]["default"]["files"] == 8
    assert "lane lo: retired after 2 failures in a row" in r.stdout
    # every lane broken: the run fails and says why
    r = run_fetch(*fetch_args(model_lock, tmp_path / "n", hub, "--uplink", "lo=192.0.2.77",
                              "--lane-failures", "2"))  # fmt: skip
    assert r.returncode == 1 and "no lane left" in r.stdout


@pytest.mark.parametrize("delta", [-1, +1])
def test_lockfile_size_disagreeing_with_server_fails_that_file_alone(
    hub: Hub, model_lock: Path, tmp_path: Path, delta: int
) -> None:
    """A lockfile entry whose size differs from what the server sends is the lockfile's fault,
    not the network's: that file fails once with both sizes named, no lane is retired and every
    other file is fetched."""
    lock = json.loads(model_lock.read_text())
    entry = next(f for f in lock["files"] if f["path"] == MID)
    real = entry["size"]
    entry["size"] = real + delta
    bad_lock = tmp_path / "bad.lock.json"
    bad_lock.write_text(json.dumps(lock))
    dest = tmp_path / "m"
    r = run_fetch(*fetch_args(bad_lock, dest, hub, "--lane-failures", "1"))
    assert r.returncode == 1, r.stdout
    assert f"{MID}: lockfile says {real + delta} bytes, server sent {real}" in r.stdout
    assert "retired" not in r.stdout and "no lane left" not in r.stdout
    status = json.loads((tmp_path / "m.fetch-status.json").read_text())
    assert [x["path"] for x in status["failed"]] == [MID]
    assert len(body_requests(hub, entry["sha256"])) == 1  # not retried
    others = [x for x in lock_files(model_lock) if x["path"] != MID]
    assert all((dest / x["path"]).stat().st_size == x["size"] for x in others)


def test_serve_lock_in_publishes_only_each_lockfiles_files_under_its_subdir(
    hub: Hub, model_lock: Path, tmp_path: Path
) -> None:
    """The head serves weights_dir with --lock-in <subdir>=<lockfile>: another revision's files,
    a file beside the lockfile's and anything outside the subdir answer 404 (issue 35 item 6)."""
    weights = tmp_path / "weights"
    src = weights / "model-abc"
    assert run_fetch(*fetch_args(model_lock, src, hub)).returncode == 0
    (src / "notinlock.txt").write_bytes(b"n")
    other = weights / "model-old"
    other.mkdir()
    (other / "config.json").write_bytes(b"{}")
    (weights / "secret.txt").write_bytes(b"s")
    port = 19000 + os.getpid() % 1000
    srv = subprocess.Popen(
        [sys.executable, FETCH, "serve", "--dir", str(weights), "--listen", f"127.0.0.1:{port}",
         f"--lock-in=model-abc={model_lock}", "--max-seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}/"
        poll(lambda: answers(base + "model-abc/config.json"), "serve --lock-in answering")
        for bad in ("model-abc/notinlock.txt", "model-old/config.json", "secret.txt",
                    "config.json", "model-abc/../secret.txt"):  # fmt: skip
            with pytest.raises(urllib.error.HTTPError) as ei:
                urllib.request.urlopen(base + bad, timeout=5)
            assert ei.value.code == 404, bad
        with urllib.request.urlopen(base + "model-abc/" + BIG, timeout=5) as resp:
            assert resp.read() == (src / BIG).read_bytes()
    finally:
        srv.terminate()
        srv.wait(timeout=10)

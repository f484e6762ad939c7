"""Stop-together and watchdog decisions of files/sparkrig_pair.py, and its agent on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkrig.scripts import load_script

FILE = Path(__file__).resolve().parents[2] / "files" / "sparkrig_pair.py"
pair = load_script("sparkrig_pair", FILE)


def test_a_peer_that_was_up_and_misses_three_probes_stops_the_rank():
    w = pair.PeerWatch(["10.0.0.2"], fails=3, grace=100, now=0)
    w.observe("10.0.0.2", True)
    for _ in range(2):
        w.observe("10.0.0.2", False)
        assert w.verdict(1) is None
    w.observe("10.0.0.2", False)
    assert "went down" in w.verdict(2)


def test_a_blip_resets_the_count():
    w = pair.PeerWatch(["a"], fails=3, grace=100, now=0)
    for up in (True, False, False, True, False, False):
        w.observe("a", up)
    assert w.verdict(5) is None


def test_a_peer_that_never_comes_up_stops_the_rank_after_the_grace_only():
    w = pair.PeerWatch(["a", "b"], fails=3, grace=100, now=0)
    w.observe("a", True)
    w.observe("b", False)
    assert w.verdict(99) is None
    assert "never came up" in w.verdict(100)


def test_watchdog_restarts_a_pair_that_went_down_but_not_one_an_operator_stopped():
    p = pair.WatchdogPolicy(fails=3, grace=60, max_restarts=3, window=3600)
    assert p.observe(0, active=False, pair_down=False, probe_ok=None) == ""
    assert p.observe(10, active=False, pair_down=True, probe_ok=None) == "restart"


def test_watchdog_waits_out_the_grace_then_restarts_after_consecutive_failed_probes():
    p = pair.WatchdogPolicy(fails=3, grace=60, max_restarts=3, window=3600)
    assert p.observe(0, True, False, None) == ""  # start seen
    assert p.observe(30, True, False, False) == ""  # within grace: ignored
    assert p.observe(61, True, False, False) == ""
    assert p.observe(62, True, False, True) == ""  # success resets
    assert p.observe(63, True, False, False) == ""
    assert p.observe(64, True, False, False) == ""
    assert p.observe(65, True, False, False) == "restart"


def test_watchdog_gives_up_after_the_restart_budget():
    p = pair.WatchdogPolicy(fails=1, grace=5, max_restarts=2, window=1000)
    assert p.observe(0, False, True, None) == "restart"
    assert p.observe(10, False, True, None) == "restart"
    assert p.observe(20, False, True, None) == "give-up"
    assert p.observe(1011, False, True, None) == "restart"  # the window moved on


def test_watchdog_lets_a_restart_take_before_judging_again():
    p = pair.WatchdogPolicy(fails=1, grace=60, max_restarts=3, window=3600)
    assert p.observe(0, False, True, None) == "restart"
    # the old failed state is still visible while the restart is under way
    assert p.observe(5, False, True, None) == ""
    assert p.observe(59, False, True, None) == ""
    assert p.observe(61, False, True, None) == "restart"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fake_systemctl(tmp_path):
    log = tmp_path / "systemctl.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    script.chmod(0o755)
    return bin_dir, log


def test_agent_starts_the_unit_only_for_the_right_token(tmp_path, fake_systemctl):
    bin_dir, log = fake_systemctl
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FILE), "agent", "--listen", f"127.0.0.1:{port}",
         "--unit", "sparkrig-worker.service", "--token-file", str(token)],
        env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "agent did not start"
                time.sleep(0.1)
        assert pair.ask("127.0.0.1", port, "wrong", "start") is False
        assert pair.ask("127.0.0.1", port, "s3cret", "reboot") is False
        assert not log.exists()
        assert pair.ask("127.0.0.1", port, "s3cret", "stop") is True
        assert pair.ask("127.0.0.1", port, "s3cret", "start") is True
        assert log.read_text().splitlines() == [
            "stop sparkrig-worker.service",
            "--no-block start sparkrig-worker.service",
        ]
    finally:
        proc.terminate()
        proc.wait(5)


class Beacon:
    """A peer's beacon on loopback: 503 (container not running) until ``up`` is set."""

    def __init__(self) -> None:
        import http.server
        import threading

        beacon = self
        self.up = False
        self.hits = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                beacon.hits += 1
                self.send_response(200 if beacon.up else 503)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_main(port: int, timeout: float) -> int:
    argv = ["wait", "--peers", "127.0.0.1", "--port", str(port), "--timeout", str(timeout)]
    return pair.main([*argv, "--interval", "0.1"])


def test_wait_holds_while_a_peer_answers_503_and_passes_once_it_answers_200():
    import threading

    beacon = Beacon()
    try:
        assert wait_main(beacon.port, 1) == 1  # answering, but its container is not running
        assert beacon.hits >= 2
        result: list[int] = []
        waiter = threading.Thread(target=lambda: result.append(wait_main(beacon.port, 60)))
        waiter.start()
        deadline = time.monotonic() + 30
        while beacon.hits < 4:  # the waiter is polling the 503
            assert time.monotonic() < deadline, "wait never probed the beacon"
            time.sleep(0.05)
        assert result == []  # still waiting
        beacon.up = True
        waiter.join(60)
        assert result == [0]
    finally:
        beacon.close()


def test_wait_times_out_on_a_peer_nobody_listens_for():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        assert wait_main(port, 1) == 1


@pytest.mark.parametrize(
    ("show", "expected"),
    [
        ("Result=success\nActiveState=activating\n", (True, False)),  # systemd's order
        ("ActiveState=active\nResult=success\n", (True, False)),
        ("Result=exit-code\nActiveState=failed\n", (False, True)),  # a dead container
        ("Result=success\nActiveState=inactive\n", (False, False)),  # an operator's stop
    ],
)
def test_unit_state_reads_keys_not_positions(show, expected):
    assert pair.parse_unit_state(show) == expected

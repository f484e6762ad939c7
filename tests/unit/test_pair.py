"""Stop-together and watchdog decisions of the host package's pair job (files/sparkhost/pair.py),
and its agent on loopback."""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sparkhost import pair, pairmac
from sparkhost.helperhttp import GuardedServer
from sparkhost.units import parse_unit_state

from sparkrig.hostpkg import SOURCE

WAIT_S = 30.0  # how long a test waits for what it expects: a bound on a hang, never a speed

SECRET = "0123456789abcdef" * 3  # 48 hex digits, as sparkrig makes them
KEY = pairmac.derive(SECRET)


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


def test_watchdog_leaves_a_pair_that_is_down_to_the_supervisor():
    p = pair.WatchdogPolicy(fails=1, grace=0, max_restarts=3, window=3600)
    assert [p.observe(t, active=False, probe_ok=None) for t in (0, 100, 200)] == ["", "", ""]


def test_watchdog_waits_out_the_grace_then_restarts_after_consecutive_failed_probes():
    p = pair.WatchdogPolicy(fails=3, grace=60, max_restarts=3, window=3600)
    assert p.observe(0, True, None) == ""  # start seen
    assert p.observe(30, True, False, health_ok=True) == ""  # within grace: ignored
    assert p.observe(61, True, False) == ""
    assert p.observe(62, True, True) == ""  # success resets
    assert p.observe(63, True, False) == ""
    assert p.observe(64, True, False) == ""
    assert p.observe(65, True, False) == "restart"


def test_watchdog_counts_failures_only_after_the_first_health_200_since_the_start():
    p = pair.WatchdogPolicy(fails=2, grace=60, max_restarts=3, window=3600)
    assert p.observe(0, True, None) == ""
    for t in range(61, 4000, 60):  # a cold boot past the grace: /health not up yet
        assert p.observe(t, True, False, health_ok=False) == ""
    assert p.observe(4001, True, False, health_ok=True) == ""  # first 200: count from here
    assert p.observe(4061, True, False) == "restart"
    assert not p.healthy  # the next start has to come up again before it is judged
    assert p.observe(9000, True, False) == ""


def test_watchdog_gives_up_after_the_restart_budget():
    p = pair.WatchdogPolicy(fails=1, grace=5, max_restarts=2, window=1000)
    for t in (0, 10, 20):
        p.observe(t, True, None, health_ok=True)
    assert p.observe(30, True, False) == "restart"
    p.observe(40, True, None, health_ok=True)
    assert p.observe(50, True, False) == "restart"
    p.observe(60, True, None, health_ok=True)
    assert p.observe(70, True, False) == "give-up"


def test_watchdog_lets_a_restart_take_before_judging_again():
    p = pair.WatchdogPolicy(fails=1, grace=60, max_restarts=3, window=3600)
    p.observe(0, True, None, health_ok=True)
    assert p.observe(60, True, False) == "restart"
    assert p.observe(100, True, False) == ""  # the restart is still taking
    assert p.observe(119, True, False) == ""


def test_supervisor_restarts_a_pair_that_went_down_by_itself_once_every_worker_is_back():
    p = pair.SupervisorPolicy(max_restarts=3, window=3600, settle=60)
    # the worker rebooted: the head went down by stop-together, the worker is not back yet
    assert p.observe(0, active=False, went_down=True, operator=False, workers_ready=False) == "wait"
    assert p.observe(500, False, True, False, False) == "wait"  # no bound: it keeps waiting
    assert p.observe(900, False, True, False, True) == "restart"
    assert p.observe(910, False, True, False, True) == ""  # the restart is still taking
    assert p.observe(970, True, False, False, True) == ""  # serving


def test_supervisor_never_undoes_an_operator_stop_nor_starts_a_fresh_host():
    p = pair.SupervisorPolicy(max_restarts=3, window=3600, settle=60)
    assert p.observe(0, False, went_down=True, operator=True, workers_ready=True) == ""
    assert p.observe(10, False, went_down=False, operator=False, workers_ready=True) == ""
    assert p.restarts == []


def test_supervisor_gives_up_after_its_budget_and_the_window_moves_on():
    p = pair.SupervisorPolicy(max_restarts=2, window=1000, settle=10)
    assert p.observe(0, False, True, False, True) == "restart"
    assert p.observe(20, False, True, False, True) == "restart"
    assert p.observe(40, False, True, False, True) == "give-up"
    assert p.observe(1001, False, True, False, True) == "restart"


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for name in ("MARKER", "OPERATOR", "RESTART_LOCK"):
        monkeypatch.setattr(pair, name, str(run / getattr(pair, name).rsplit("/", 1)[1]))
    monkeypatch.setattr(pair, "docker_state", lambda: "")  # docker serving, unless a test says
    return run


def test_a_stop_request_is_an_operators_unless_sparkrig_stopped_it(run_dir, monkeypatch):
    monkeypatch.delenv("EXIT_CODE", raising=False)
    # the container died: systemd sets EXIT_CODE for ExecStop, and that is no one's request
    monkeypatch.setenv("EXIT_CODE", "exited")
    assert pair.main(["stopping", "--unit", "sparkrig-head.service"]) == 0
    assert not (run_dir / "operator-stop").exists()
    monkeypatch.delenv("EXIT_CODE")
    pair.mark_pair_down("peer 10.0.0.2 went down")  # stop-together
    assert pair.main(["stopping", "--unit", "sparkrig-head.service"]) == 0
    assert not (run_dir / "operator-stop").exists()
    (run_dir / "pair-down").unlink()
    assert pair.main(["stopping", "--unit", "sparkrig-head.service"]) == 0  # systemctl stop
    assert "sparkrig-head.service stopped by request" in (run_dir / "operator-stop").read_text()


def test_one_ordered_restart_at_a_time(run_dir):
    first, second = pair.RestartLock(), pair.RestartLock()
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


def head_down_supervisor(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[str], list[str], argparse.Namespace, pair.SupervisorPolicy]:
    """A supervisor round's world with the head unit down: (restarts asked for, lines logged,
    the supervisor's args, its policy: 3 restarts an hour)."""
    restarts: list[str] = []
    logged: list[str] = []
    monkeypatch.setattr(pair, "unit_state", lambda unit: (False, False))  # the head is down
    monkeypatch.setattr(pair, "_restart_pair", lambda args: restarts.append("restart") or 0)
    monkeypatch.setattr(pair, "write_budget", lambda *a: None)
    monkeypatch.setattr(pair, "log", logged.append)
    args = argparse.Namespace(
        head_unit="sparkrig-head.service", agent_port=29601, max_restarts=3, window=3600
    )
    return restarts, logged, args, pair.SupervisorPolicy(max_restarts=3, window=3600, settle=60)


def test_the_supervisor_leaves_someone_elses_ordered_restart_alone_and_spends_no_budget(
    run_dir, monkeypatch
):
    """An operator's sparkrig-restart-pair stops the head with the pair-down marker written: the
    supervisor must not take that for the pair going down by itself (its budget is 3 in 6 h)."""
    monkeypatch.setattr(pair, "agent_ready", lambda w, port: (True, "ready"))
    restarts, logged, args, policy = head_down_supervisor(monkeypatch)
    pair.mark_pair_down("ordered restart of the pair")
    theirs = pair.RestartLock()
    assert theirs.acquire()  # the operator's restart is under way
    assert pair.supervise_round(args, policy, ["10.0.0.2"], "") == ""
    assert restarts == [] and policy.restarts == [] and logged == []  # not even "went down"
    # one that began between the round's look and its restart is not counted either
    monkeypatch.setattr(pair, "restart_under_way", lambda: False)
    pair.supervise_round(args, policy, ["10.0.0.2"], "")
    assert restarts == [] and policy.restarts == []
    theirs.release()  # it failed half way, leaving the pair down: now it is the supervisor's
    pair.supervise_round(args, policy, ["10.0.0.2"], "")
    assert restarts == ["restart"] and len(policy.restarts) == 1


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
    # docker's state (sparkhost.pair.docker_state) is answered, not logged: FAKE_DOCKER or active
    script.write_text(
        '#!/bin/sh\ncase "$1" in is-active) echo "${FAKE_DOCKER:-active}"; exit 0 ;;'
        f' list-jobs) exit 0 ;; esac\necho "$@" >> {log}\n'
    )
    script.chmod(0o755)
    return bin_dir, log


def start_agent(
    tmp_path: Path, bin_dir: Path, hosts: tuple[str, ...] = ("127.0.0.1",), **env: str
) -> tuple[subprocess.Popen, int]:
    """The worker agent on loopback (the pair secret SECRET, run dir tmp_path/run; ``hosts``: the
    addresses it listens on), once it listens on every one."""
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    path = f"{bin_dir}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "SPARKRIG_RUN_DIR": str(tmp_path / "run"), **env}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SOURCE), "pair", "agent",
         "--listen", ",".join(f"{h}:{port}" for h in hosts),
         "--unit", "sparkrig-worker.service", "--token-file", str(token)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            for host in hosts:
                socket.create_connection((host, port), 1).close()
            return proc, port
        except OSError:
            if time.monotonic() >= deadline:
                proc.terminate()
                raise AssertionError("agent did not start") from None
            time.sleep(0.1)


def test_agent_starts_the_unit_only_for_a_request_signed_with_the_pair_secret(
    tmp_path, fake_systemctl
):
    bin_dir, log = fake_systemctl
    run = tmp_path / "run"
    proc, port = start_agent(tmp_path, bin_dir)
    try:
        assert pair.ask("127.0.0.1", port, pairmac.derive("x" * 48), "start") is False
        assert pair.ask("127.0.0.1", port, KEY, "reboot") is False
        assert not log.exists()
        assert pair.agent_ready("127.0.0.1", port) == (True, "ready")
        assert pair.ask("127.0.0.1", port, KEY, "stop") is True
        # the head's stop: marked as sparkrig's own, so the rank's ExecStop does not call it an
        # operator's
        assert "ordered restart requested by 127.0.0.1" in (run / "pair-down").read_text()
        assert pair.ask("127.0.0.1", port, KEY, "start") is True
        assert log.read_text().splitlines() == [
            "stop sparkrig-worker.service",
            "--no-block start sparkrig-worker.service",
        ]
        (run / "operator-stop").write_text("sparkrig-worker.service stopped by request\n")
        ok, why = pair.agent_ready("127.0.0.1", port)
        assert not ok and "stopped by request" in why
    finally:
        proc.terminate()
        proc.wait(5)


def test_an_agent_on_two_addresses_takes_a_request_signed_for_the_one_it_arrived_at(
    tmp_path, fake_systemctl
):
    """On a triangle or a ring each peer dials the agent at its own address of the plan: the
    agent answers on each, and a request signed for one address is refused at the other (the
    MAC names its receiver)."""
    bin_dir, log = fake_systemctl
    proc, port = start_agent(tmp_path, bin_dir, hosts=("127.0.0.1", "127.0.0.2"))
    try:
        assert pair.ask("127.0.0.2", port, KEY, "start") is True
        assert pair.agent_ready("127.0.0.2", port) == (True, "ready")
        req = pair.signed_post("127.0.0.1", port, "/start", KEY)
        req.full_url = f"http://127.0.0.2:{port}/start"  # signed for .1, sent to .2
        status, why = post_status(req)
        assert status == 401, why
        assert pair.ask("127.0.0.1", port, KEY, "start") is True
        assert log.read_text().splitlines() == ["--no-block start sparkrig-worker.service"] * 2
    finally:
        proc.terminate()
        proc.wait(5)


def post_status(req) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_captured_stop_replayed_to_the_agent_is_refused(tmp_path, fake_systemctl):
    """What a stranger on the fabric could capture is a signed /stop: sent again, to this agent
    (409) or with the secret itself as the old static header (401), it stops nothing."""
    import urllib.request

    bin_dir, log = fake_systemctl
    proc, port = start_agent(tmp_path, bin_dir)
    try:
        captured = pair.signed_post("127.0.0.1", port, "/stop", KEY)
        assert post_status(captured)[0] == 202
        assert post_status(captured) == (409, "replayed: this request was already answered\n")
        bearer = urllib.request.Request(
            f"http://127.0.0.1:{port}/stop", method="POST", headers={"X-Sparkrig-Token": SECRET}
        )
        assert post_status(bearer)[0] == 401
        old = pairmac.sign(KEY, "POST", "/stop", f"127.0.0.1:{port}", now=time.time() - 3600)
        stale = urllib.request.Request(f"http://127.0.0.1:{port}/stop", method="POST", headers=old)
        status, why = post_status(stale)
        assert status == 401 and re.match(r"stale: signed -360[01] s from this rank's clock", why)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=5)[0]
    assert log.read_text().splitlines() == ["stop sparkrig-worker.service"]  # once
    assert "POST /stop from 127.0.0.1 refused: replayed" in out  # the journal says so
    assert re.search(r"POST /stop from 127\.0\.0\.1 refused: stale: signed -360[01] s", out)


@pytest.mark.parametrize("text", ["", "s3cret", SECRET[:31]])
@pytest.mark.parametrize("mode", ["agent", "supervise"])
def test_a_helper_refuses_to_start_on_an_empty_or_short_secret(tmp_path, mode, text):
    token = tmp_path / "pair-token"
    token.write_text(text + "\n")
    argv = [sys.executable, str(SOURCE), "pair", mode, "--listen", f"127.0.0.1:{free_port()}",
            "--token-file", str(token)]  # fmt: skip
    if mode == "agent":
        argv += ["--unit", "sparkrig-worker.service"]
    else:
        argv += ["--head-unit", "sparkrig-head.service", "--workers", "127.0.0.2", "--port", "1",
                 "--agent-port", "1"]  # fmt: skip
    env = {**os.environ, "SPARKRIG_RUN_DIR": str(tmp_path / "run")}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"the pair secret {token} is" in done.stdout
    assert "re-run the deploy (pyinfra inventory.py deploy.py)" in done.stdout
    assert not text or text not in done.stdout


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
    assert parse_unit_state(show) == expected


def serve(handler) -> tuple[object, int]:
    import threading

    server = GuardedServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_the_heads_start_gate_asks_a_missing_workers_agent_to_start_its_rank(tmp_path):
    import http.server

    started = []

    class Beacon(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if started else 503)
            self.end_headers()

        def log_message(self, *a):
            pass

    verifier = pairmac.Verifier(KEY)

    class Agent(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            fields = {name: self.headers.get(name, "") for name in pairmac.FIELDS}
            receiver = "{}:{}".format(*self.connection.getsockname()[:2])
            ok = verifier.check(fields, "POST", "/start", receiver) == (0, "")
            if ok:
                started.append(self.path)
            self.send_response(202 if ok else 403)
            self.end_headers()

        def log_message(self, *a):
            pass

    (beacon, bport), (agent, aport) = serve(Beacon), serve(Agent)
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    try:
        argv = ["wait", "--peers", "127.0.0.1", "--port", str(bport), "--timeout", "3"]
        assert pair.main(argv) == 1  # without the agent it only waits
        assert started == []
        argv += ["--agent-port", str(aport), "--token-file", str(token)]
        assert pair.main(argv) == 0
        assert started == ["/start"]
    finally:
        beacon.shutdown()
        agent.shutdown()


class HeadWithSupervisor:
    """The head on loopback: its supervisor (the pair secret SECRET; an ordered restart only
    recorded; a budget of ``max_restarts`` an hour) and its beacon, answering 200 while ``up()``
    says so (default: once a restart was asked)."""

    def __init__(self, tmp_path: Path, monkeypatch, up=None, max_restarts: int = 3) -> None:
        import argparse
        import http.server

        self.restarts: list[object] = []
        self.token = tmp_path / "token"
        self.token.write_text(SECRET + "\n")
        monkeypatch.setattr(pair, "RESTART_LOCK", str(tmp_path / "restart.lock"))
        monkeypatch.setattr(pair, "RUN", str(tmp_path / "run"))  # the budget file
        monkeypatch.setattr(pair, "_restart_pair", lambda args: self.restarts.append(args) or 0)
        head = self
        self.up = up or (lambda: bool(head.restarts))

        class HeadBeacon(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if head.up() else 503)
                self.end_headers()

            def log_message(self, *a):
                pass

        pair.Supervisor.args = argparse.Namespace(timeout=5, head_unit="sparkrig-head.service")
        pair.Supervisor.policy = pair.SupervisorPolicy(max_restarts, 3600, settle=5)
        monkeypatch.setattr(pair.Supervisor, "verifier", pairmac.Verifier(KEY))
        (self.sup, self.sport), (self.beacon, self.bport) = (
            serve(pair.Supervisor),
            serve(HeadBeacon),
        )

    def argv(self, mode: str) -> list[str]:
        return [mode, "--head", "127.0.0.1", "--port", str(self.bport),
                "--agent-port", str(self.sport)]  # fmt: skip

    def close(self) -> None:
        self.sup.shutdown()
        self.beacon.shutdown()


def test_a_worker_without_its_head_in_the_run_asks_the_heads_supervisor(tmp_path, monkeypatch):
    head = HeadWithSupervisor(tmp_path, monkeypatch)
    try:
        argv = [*head.argv("request"), "--timeout", "5", "--token-file"]
        wrong = tmp_path / "wrong"
        wrong.write_text("guess\n")
        assert pair.main([*argv, str(wrong)]) == 1
        assert head.restarts == []
        assert pair.main([*argv, str(head.token)]) == 0
        assert len(head.restarts) == 1
    finally:
        head.close()


def test_a_workers_request_past_the_supervisors_budget_is_refused_with_why(
    tmp_path, monkeypatch, capsys
):
    head = HeadWithSupervisor(tmp_path, monkeypatch, max_restarts=1)
    try:
        argv = [*head.argv("request"), "--timeout", "5", "--token-file", str(head.token)]
        assert pair.main(argv) == 0
        assert pair.main(argv) == 1
        assert len(head.restarts) == 1  # the second one was not run
        out = capsys.readouterr().out
        assert "the supervisor's budget of 1 restarts in 3600 s is spent" in out
        assert re.search(r"the next is allowed in 3[56]\d\d s", out), out
        status, why = post_status(pair.signed_post("127.0.0.1", head.sport, "/restart-pair", KEY))
        assert status == 429 and "budget" in why
    finally:
        head.close()


def test_the_restart_budget_file_is_what_status_reads(monkeypatch, tmp_path):
    from sparkrig.status import parse_rank_state

    monkeypatch.setattr(pair, "RUN", str(tmp_path))
    now = time.monotonic()
    pair.write_budget("supervisor", [now - 30000, now - 100], 3, 21600)
    text = Path(pair.budget_file("supervisor")).read_text()
    assert text.endswith("\n") and text.count("\n") == 1  # one line: the status script's value
    state = parse_rank_state([f"budget_supervisor={text.strip()}", "##SPARKRIG-END##"])
    ((helper, budget),) = state.budgets
    assert helper == "supervisor" and budget.max_restarts == 3
    assert budget.used(time.time()) == 1  # wall-clock times: the older one left the window
    assert budget.text(time.time()) == "1/3 in 6 h"


# ---------------------------------------------------------------------------------------------
# docker going away (issue 27): the rank goes down with it, the supervisor restarts the pair in
# order once docker is back on every rank, and an operator's stop is still left alone
# ---------------------------------------------------------------------------------------------


def test_docker_is_gone_while_a_stop_or_restart_of_it_is_queued_or_it_is_not_active():
    assert pair.docker_gone("active\n", "") == ""
    # the rank's ExecStop runs first (the rank is ordered after docker): docker's job waits
    queued = pair.docker_gone("active\n", "812 docker.service restart waiting\n")
    assert queued == "docker is going away (docker.service restart)"
    stop = "901 docker.socket stop waiting\n902 docker.service stop waiting\n"
    assert "docker.socket stop, docker.service stop" in pair.docker_gone("active\n", stop)
    assert pair.docker_gone("inactive\n", "") == "docker.service is inactive"
    # dockerd killed: Restart=always holds the unit in activating (auto-restart)
    assert pair.docker_gone("activating\n", "") == "docker.service is activating"


@pytest.mark.parametrize("exit_code", ["", "exited"])
def test_a_rank_that_goes_down_with_docker_went_down_by_itself(run_dir, monkeypatch, exit_code):
    """Stopped with docker (systemd's propagated stop: no EXIT_CODE) or its container gone with
    the daemon (EXIT_CODE set): marked as the pair going down, never as an operator's stop."""
    monkeypatch.setenv("EXIT_CODE", exit_code)
    monkeypatch.setattr(pair, "docker_state", lambda: "docker is going away (docker.service stop)")
    assert pair.main(["stopping", "--unit", "sparkrig-worker.service"]) == 0
    assert not (run_dir / "operator-stop").exists()
    assert "went down with docker" in (run_dir / "pair-down").read_text()


def test_an_operators_stop_with_docker_running_is_still_an_operators(run_dir, monkeypatch):
    monkeypatch.delenv("EXIT_CODE", raising=False)
    monkeypatch.setattr(pair, "docker_state", lambda: "")
    assert pair.main(["stopping", "--unit", "sparkrig-worker.service"]) == 0
    assert "stopped by request" in (run_dir / "operator-stop").read_text()
    assert not (run_dir / "pair-down").exists()


def test_the_supervisor_waits_for_docker_on_every_rank_then_restarts_the_pair_once(
    run_dir, monkeypatch
):
    docker = {"head": "docker.service is inactive", "worker": (False, "docker.service is inactive")}
    monkeypatch.setattr(pair, "docker_state", lambda: docker["head"])
    monkeypatch.setattr(pair, "agent_ready", lambda w, port: docker["worker"])
    restarts, logged, args, policy = head_down_supervisor(monkeypatch)
    pair.mark_pair_down("sparkrig-head.service went down with docker: docker.service is inactive")
    said = pair.supervise_round(args, policy, ["10.0.0.2"], "")
    assert restarts == [] and policy.restarts == []
    assert "the head (docker.service is inactive)" in said
    assert "10.0.0.2 (docker.service is inactive)" in said
    docker["head"] = ""  # docker back on the head, not yet on the worker
    said = pair.supervise_round(args, policy, ["10.0.0.2"], said)
    assert restarts == [] and "the head" not in said and "10.0.0.2" in said
    docker["worker"] = (True, "ready")
    pair.supervise_round(args, policy, ["10.0.0.2"], said)
    assert restarts == ["restart"] and len(policy.restarts) == 1
    assert "went down with docker" in logged[-1]


def test_an_agent_answers_not_ready_while_docker_is_down_and_an_operator_stop_wins(
    tmp_path, fake_systemctl
):
    bin_dir, log = fake_systemctl
    run = tmp_path / "run"
    proc, port = start_agent(tmp_path, bin_dir, FAKE_DOCKER="inactive")
    try:
        assert pair.agent_ready("127.0.0.1", port) == (False, "docker.service is inactive")
        run.mkdir(exist_ok=True)
        (run / "operator-stop").write_text("sparkrig-worker.service stopped by request\n")
        ok, why = pair.agent_ready("127.0.0.1", port)
        assert not ok and "stopped by request" in why
        assert not log.exists()  # reading docker's state starts nothing
    finally:
        proc.terminate()
        proc.wait(5)


def test_a_worker_never_starts_while_the_heads_rank_runs(tmp_path, monkeypatch):
    """`pair alone`, a worker's start gate: the head's beacon answering 200 refuses the start and
    asks the head's supervisor for an ordered restart; a head that is down lets it start."""
    head_up = [False]
    head = HeadWithSupervisor(tmp_path, monkeypatch, up=lambda: head_up[0])
    try:
        argv = [*head.argv("alone"), "--token-file", str(head.token)]
        assert pair.main(argv) == 0  # the head is down: the worker starts (ordered start)
        assert head.restarts == []
        head_up[0] = True
        assert pair.main(argv) == 1  # the head's engine runs: never join it alone
        deadline = time.monotonic() + 10
        while not head.restarts and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(head.restarts) == 1  # the supervisor was asked for the ordered restart
    finally:
        head.close()


def start_watch(
    tmp_path: Path, package: Path, nofile: int = 0, hosts: tuple[str, ...] = ("127.0.0.1",)
) -> tuple[subprocess.Popen, int, Path]:
    """The stop-together watch run from ``package`` (a copy of the host package) on loopback,
    watching its own beacon, with a docker that says its container runs and a systemctl that
    logs what it is asked (``nofile``: its descriptor limit, as a unit's LimitNOFILE; ``hosts``:
    the addresses it listens on, each a peer's way to it on a ring); once its beacon answers on
    every one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # what `docker inspect --format {{.State.Running}} NAME` prints for a running container, the
    # one docker call the watch makes (sparkhost.pair.container_running)
    (bin_dir / "docker").write_text("#!/bin/sh\necho true\n")
    log = tmp_path / "systemctl.log"
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SPARKRIG_RUN_DIR": str(tmp_path / "run")}  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(package), "pair", "watch", "--unit", "sparkrig-head.service",
         "--container", "rank0", "--listen", ",".join(f"{h}:{port}" for h in hosts),
         "--peers", ",".join(hosts),
         "--port", str(port), "--interval", "0.2", "--fails", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
        if nofile else None,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not all(pair.beacon_up(h, port, timeout=1) for h in hosts):
        if time.monotonic() >= deadline:
            proc.kill()
            raise AssertionError(f"the watch did not answer: {proc.communicate()[0]}")
        time.sleep(0.1)
    return proc, port, log


@pytest.mark.parametrize("hosts", [("127.0.0.1",), ("127.0.0.1", "127.0.0.2")])
def test_a_reloaded_watch_runs_its_new_program_and_its_beacon_never_stops_answering(
    tmp_path, hosts
):
    """A reload (SIGHUP, the deploy's answer to a new host package) execs the new program in the
    same process with the beacon's sockets kept: a peer probing all along never misses (issue 31:
    a restart closed the port for ~6 s and the worker's watch stopped its rank). On a ring the
    beacon listens on each address a peer dials (two here): each is handed over."""
    import shutil
    import threading

    package = tmp_path / "lib" / "sparkhost"
    shutil.copytree(SOURCE, package)
    proc, port, log = start_watch(tmp_path, package, hosts=hosts)
    misses, probes, stop = [], [0], threading.Event()

    def probe() -> None:
        while not stop.is_set():
            for host in hosts:
                probes[0] += 1
                if not pair.beacon_up(host, port, timeout=10):
                    misses.append((host, time.monotonic()))
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        time.sleep(0.5)
        before = probes[0]
        # the new program: its beacon says so, which the old one never does
        pair_py = package / "pair.py"
        pair_py.write_text(pair_py.read_text().replace("'running' if up", "'running v2' if up"))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        body = ""
        while "running v2" not in body and time.monotonic() < deadline:
            body = urlopen_text(f"http://{hosts[-1]}:{port}/")
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        stop.set()
        prober.join()
        proc.terminate()
        out = proc.communicate(timeout=10)[0]
    assert "running v2" in body, out  # the same process answers with the new program
    assert probes[0] > before + 10
    assert misses == [], out  # no probe went unanswered across the exec
    assert not log.exists(), out  # and the watch never stopped its rank
    assert "reload: handing the beacon's sockets to the new program" in out


def urlopen_text(url: str) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def test_a_flood_of_idle_connections_to_the_beacon_never_stops_the_pair(tmp_path):
    """Issue 35: about a thousand idle connections exhausted the beacon (one thread and one
    descriptor each, systemd's default soft limit of 1024), its peers' probes failed and the pair
    stopped itself. The watch here probes its own beacon and stops its rank at the first miss."""
    proc, port, log = start_watch(tmp_path, SOURCE, nofile=1024)
    idle: list[socket.socket] = []
    try:
        for _ in range(1200):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        answered: list[bool] = []
        end = time.monotonic() + 3  # the watch probes its beacon 15 times meanwhile
        while time.monotonic() < end or len(answered) < 10:
            answered.append(pair.beacon_up("127.0.0.1", port))
        assert proc.poll() is None
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        out = proc.communicate(timeout=10)[0]
    assert all(answered), out
    assert not log.exists(), out  # the watch never stopped its rank


def test_a_reloaded_watch_answers_before_a_slow_docker_does(tmp_path):
    """After the exec the new program answers with the container state the old one knew: it never
    waits on `docker inspect` first (on a loaded host docker takes seconds, longer than a peer's
    probe waits, and three such probes read as this rank going down). Here docker answers nothing
    until the test lets it, after the new program has answered: one that waited on it first never
    would (its `docker inspect` times out at 30 s, and then it says not running)."""
    import shutil
    import threading

    package = tmp_path / "lib" / "sparkhost"
    shutil.copytree(SOURCE, package)
    proc, port, log = start_watch(tmp_path, package)
    calls, release = tmp_path / "docker.calls", tmp_path / "docker.release"
    # from now on every docker call waits for the release (at most 120 s, so none outlives us)
    (tmp_path / "bin" / "docker").write_text(
        f"#!/bin/sh\necho called >> {calls}\n"
        f"i=0; while [ ! -e {release} ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done\n"
        "echo true\n"
    )
    misses, stop = [], threading.Event()

    def probe() -> None:
        while not stop.is_set():
            if not pair.beacon_up("127.0.0.1", port, timeout=WAIT_S):
                misses.append(time.monotonic())
            time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    body = ""
    try:
        deadline = time.monotonic() + WAIT_S
        while not calls.exists():  # the old program's refresh is held in docker already
            assert time.monotonic() < deadline, "the watch never called docker"
            time.sleep(0.05)
        # the new program: its beacon says so, which the old one never does
        pair_py = package / "pair.py"
        pair_py.write_text(pair_py.read_text().replace("'running' if up", "'running v2' if up"))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + WAIT_S
        while "running v2" not in body and time.monotonic() < deadline:
            body = urlopen_text(f"http://127.0.0.1:{port}/")
            time.sleep(0.1)
    finally:
        release.touch()
        stop.set()
        prober.join()
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert "reload: handing the beacon's sockets to the new program" in out
    assert "running v2" in body, out  # the new program, while docker had answered nothing
    assert misses == [], out
    assert not log.exists(), out


def test_a_peer_that_connects_but_answers_late_is_no_miss_until_it_stays_silent() -> None:
    """A probe that connected but timed out (None: the peer's watch holds its beacon socket open
    while its new program starts after a reload) never counts as a failed probe; only a peer
    silent for ``silent`` seconds, or refusing, is gone (issue 31: a reload that took 17 s on
    the loaded lab made the worker stop itself after three 5 s probes)."""
    w = pair.PeerWatch(["a"], fails=3, grace=100, now=0, silent=60)
    w.observe("a", True, 0)
    for t in range(1, 30):
        w.observe("a", None, t)
        assert w.verdict(t) is None
    w.observe("a", True, 30)
    assert w.verdict(59) is None
    assert w.verdict(90) == "peer a went silent (60 s unanswered)"
    w = pair.PeerWatch(["a"], fails=3, grace=100, now=0, silent=60)
    w.observe("a", True, 0)
    for t in (1, 2, 3):
        w.observe("a", False, t)
    assert w.verdict(3) == "peer a went down (3 failed probes)"


def test_a_beacon_that_accepts_but_never_answers_probes_as_unknown_and_a_closed_port_as_down():
    import socket as socketlib

    listener = socketlib.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # the kernel accepts the connection; nobody answers
    port = listener.getsockname()[1]
    try:
        assert pair.beacon_probe("127.0.0.1", port, timeout=0.5) is None
        assert pair.beacon_up("127.0.0.1", port, timeout=0.5) is False
    finally:
        listener.close()
    assert pair.beacon_probe("127.0.0.1", port, timeout=0.5) is False


def ordered_restart(monkeypatch, in_turn: bool) -> list[str]:
    """What the head's ordered restart does, in order: each agent asked, each beacon wait."""
    seen: list[str] = []
    monkeypatch.setattr(pair, "read_key", lambda path: b"k" * 32)
    monkeypatch.setattr(pair, "mark_pair_down", lambda why: None)
    monkeypatch.setattr(pair, "log", lambda msg: None)
    monkeypatch.setattr(pair.subprocess, "run", lambda argv, **kw: seen.append(" ".join(argv)))
    monkeypatch.setattr(pair, "ask", lambda w, port, key, action, timeout=180: (
        seen.append(f"{action} {w}") or True))  # fmt: skip
    monkeypatch.setattr(pair, "wait_all", lambda peers, port, up, timeout: (
        seen.append(f"up {','.join(peers)}") or True))  # fmt: skip
    args = argparse.Namespace(
        workers="10.0.0.4,10.0.0.3,10.0.0.2", token_file="t", head_unit="sparkrig-head.service",
        agent_port=29601, port=29600, timeout=5, in_turn=in_turn,
    )  # fmt: skip
    assert pair._restart_pair(args) == 0
    return seen


PINGS = ["ping 10.0.0.4", "ping 10.0.0.3", "ping 10.0.0.2"]


def test_an_ordered_restart_in_turn_starts_each_worker_once_the_one_before_is_up(monkeypatch):
    stops = [*PINGS, "systemctl stop sparkrig-head.service", "stop 10.0.0.4", "stop 10.0.0.3",
             "stop 10.0.0.2"]  # fmt: skip
    head = "systemctl --no-block start sparkrig-head.service"
    assert ordered_restart(monkeypatch, in_turn=True) == [
        *stops, "start 10.0.0.4", "up 10.0.0.4", "start 10.0.0.3", "up 10.0.0.3",
        "start 10.0.0.2", "up 10.0.0.2", head,
    ]  # fmt: skip
    assert ordered_restart(monkeypatch, in_turn=False)[len(stops) + 1 :] == [
        "start 10.0.0.3", "start 10.0.0.2", "up 10.0.0.4,10.0.0.3,10.0.0.2", head,
    ]  # fmt: skip


def test_the_heads_start_gate_in_turn_asks_only_the_first_worker_down(monkeypatch):
    up: set[str] = set()
    asked: list[tuple[int, str]] = []  # (the look it was asked in, the worker)
    looks = [0]
    monkeypatch.setattr(pair, "read_key", lambda path: b"k" * 32)
    monkeypatch.setattr(pair, "log", lambda msg: None)
    monkeypatch.setattr(pair, "beacon_up", lambda peer, port: peer in up)

    def ask(peer, port, key, action, timeout=180):
        asked.append((looks[0], peer))
        up.add(peer)  # it starts and answers by the next look
        return True

    monkeypatch.setattr(pair, "ask", ask)
    monkeypatch.setattr(pair.time, "sleep", lambda s: looks.__setitem__(0, looks[0] + 1))
    argv = ["wait", "--peers", "10.0.0.4,10.0.0.3,10.0.0.2", "--port", "29600", "--timeout",
            "60", "--agent-port", "29601", "--token-file", "t", "--in-turn"]  # fmt: skip
    assert pair.main(argv) == 0
    assert asked == [(0, "10.0.0.4"), (1, "10.0.0.3"), (2, "10.0.0.2")]
    asked.clear(), up.clear(), looks.__setitem__(0, 0)
    assert pair.main(argv[:-1]) == 0  # without --in-turn: every one down at once, in one look
    assert asked == [(0, "10.0.0.4"), (0, "10.0.0.3"), (0, "10.0.0.2")]


def restart_with_refusals(monkeypatch, refuse: set[str]) -> tuple[int, list[str], list[str]]:
    """(exit, what was done, what was logged) of an ordered restart of two workers whose agents
    refuse the actions in ``refuse`` ("ping 10.0.0.3", "stop 10.0.0.2", ...)."""
    seen: list[str] = []
    said: list[str] = []
    monkeypatch.setattr(pair, "read_key", lambda path: b"k" * 32)
    monkeypatch.setattr(pair, "mark_pair_down", lambda why: seen.append("marked"))
    monkeypatch.setattr(pair, "log", said.append)
    monkeypatch.setattr(pair.subprocess, "run", lambda argv, **kw: seen.append(" ".join(argv)))
    monkeypatch.setattr(pair, "ask", lambda w, port, key, action, timeout=180: (
        seen.append(f"{action} {w}") or f"{action} {w}" not in refuse))  # fmt: skip
    monkeypatch.setattr(pair, "wait_all", lambda peers, port, up, timeout: True)
    args = argparse.Namespace(
        workers="10.0.0.3,10.0.0.2", token_file="t", head_unit="sparkrig-head.service",
        agent_port=29601, port=29600, timeout=5, in_turn=False,
    )  # fmt: skip
    return pair._restart_pair(args), seen, said


def test_an_ordered_restart_stops_nothing_while_an_agent_refuses_a_signed_call(monkeypatch):
    """Issue 47: a worker whose clock is off refuses the head's signed calls as stale; asked
    first, before the head stops, it leaves the pair serving."""
    rc, seen, said = restart_with_refusals(monkeypatch, {"ping 10.0.0.2"})
    assert rc == 1
    assert seen == ["ping 10.0.0.3", "ping 10.0.0.2"]  # nothing stopped, nothing marked
    assert "nothing was stopped: 10.0.0.2 did not take a signed call" in said[-1]


def test_an_ordered_restart_a_worker_refuses_half_way_starts_the_head_again(monkeypatch):
    rc, seen, said = restart_with_refusals(monkeypatch, {"stop 10.0.0.2"})
    assert rc == 1
    assert seen[-1] == "systemctl --no-block start sparkrig-head.service"
    assert seen.index("systemctl stop sparkrig-head.service") < len(seen) - 1
    assert "the head is starting again" in said[-1]


def test_a_signed_call_from_a_clock_120_s_ahead_is_refused_by_a_real_agent(
    tmp_path, fake_systemctl, monkeypatch
):
    """The agent itself (a subprocess, its own clock) refuses the ping of a signer 120 s ahead,
    so the ordered restart asks nothing more of it."""
    bin_dir, log = fake_systemctl
    proc, port = start_agent(tmp_path, bin_dir)
    try:
        assert pair.ask("127.0.0.1", port, KEY, "ping", timeout=10) is True
        ahead = time.time() + 120
        monkeypatch.setattr(pairmac.time, "time", lambda: ahead)
        assert pair.ask("127.0.0.1", port, KEY, "ping", timeout=10) is False
    finally:
        proc.terminate()
        out = proc.communicate(timeout=5)[0]
    assert not log.exists()  # the agent started and stopped nothing
    assert re.search(r"POST /ping from 127\.0\.0\.1 refused: stale: signed \+1[12]\d s", out), out


def test_a_canary_whose_key_file_is_gone_is_the_watchdogs_failure_not_the_engines(tmp_path):
    """Issue 47: the head's API key file deleted, the probe cannot authenticate: that is no
    failed completion, and however many rounds it lasts the watchdog restarts nothing."""
    probe = (
        f"{sys.executable} {SOURCE} gate probe --url http://127.0.0.1:9 --model m "
        f"--api-key-file {tmp_path / 'gone'}"
    )
    assert pair.canary(probe) is None
    assert pair.canary("false") is False and pair.canary("true") is True
    # an argv, never a shell: `;` and `$(...)` are arguments, not commands
    assert pair.canary(f"echo ok; touch {tmp_path / 'pwn'}") is True
    assert pair.canary(f"echo $(touch {tmp_path / 'pwn'})") is True
    assert not (tmp_path / "pwn").exists()
    assert pair.canary(f"{tmp_path}/no-such-program") is None
    policy = pair.WatchdogPolicy(fails=3, grace=0, max_restarts=5, window=3600)
    for t in range(10):
        assert policy.observe(float(t), True, pair.canary(probe), health_ok=True) == ""
    assert policy.misses == 0

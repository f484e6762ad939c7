"""One endpoint over two pairs with REAL nginx on loopback (docs/pairs.md, sparkrig/endpoint.py):
each pair's head front rendered as the deploy renders it, in front of a tiny engine that names
its pair, the two fronts verifying each other with one CA. Each front listens on its own
loopback address (127.0.0.2 and 127.0.0.3 stand in for this head's loopback, 127.0.0.12 and
127.0.0.13 for the heads' LAN addresses); everything else is the rendered site."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import REPO, free_port, load_path
from test_front_nginx import KEY, NGINX, Front

from sparkrig import endpoint, front, fronttls
from sparkrig.config.inventory import InventoryView, build
from sparkrig.config.model import Settings

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed (install-deps.sh)")

LOOPBACK = {"pair_a": "127.0.0.2", "pair_b": "127.0.0.3"}  # each front's "127.0.0.1"
LAN = {"pair_a": "127.0.0.12", "pair_b": "127.0.0.13"}


def two_pairs(api_port: int, engine_port: int) -> dict[str, Settings]:
    unit = load_path("unit_conftest", REPO / "tests" / "unit" / "conftest.py")
    view = unit.cluster(4, api_port=api_port, engine_port=engine_port, api_tls=True)
    hosts = view.groups["head"] + view.groups["worker"]
    data = {name: dict(d) for name, d in hosts}
    for i, (name, pair) in enumerate(
        [("spark-0", "pair_a"), ("spark-1", "pair_a"), ("spark-2", "pair_b"), ("spark-3", "pair_b")]
    ):
        data[name]["pair"] = pair
        data[name]["fabric_address"] = f"192.168.{100 + 10 * (i // 2)}.{10 + i % 2}/24"
        if i % 2 == 0:
            data[name]["lan_address"] = LAN[pair]
    heads = [(n, data[n]) for n in ("spark-0", "spark-2")]
    workers = [(n, data[n]) for n in ("spark-1", "spark-3")]
    return build(InventoryView({"head": heads, "worker": workers}))


class PairEngine:
    """An engine that answers every route with its pair's name (and 200), or is gone."""

    def __init__(self, pair: str) -> None:
        self.port = free_port()
        self.seen: list[tuple[str, str | None]] = []  # (path, the front's LOCAL_HEADER)
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.path, self.headers.get(endpoint.LOCAL_HEADER)))
                body = json.dumps({"pair": pair}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Endpoint:
    """Two fronts (one per pair's head) and two engines, and a client that asks either front."""

    def __init__(self, tmp: Path) -> None:
        self.api = free_port()
        self.settings = two_pairs(self.api, free_port())
        heads = {s.pair: s for s in self.settings.values() if s.me.is_head}
        ca_key, ca_cert = fronttls.make_ca("test")
        self.ca = tmp / "ca.crt"
        self.ca.write_bytes(fronttls._pem(ca_cert))
        self.engines = {pair: PairEngine(pair) for pair in heads}
        self.fronts: dict[str, Front] = {}
        self.drain: dict[str, Path] = {}
        for pair, s in heads.items():
            d = tmp / pair
            d.mkdir()
            key, cert = fronttls.issue(ca_key, ca_cert, fronttls.tls_names(s))
            (d / "front.crt").write_bytes(fronttls._pem(cert))
            (d / "front.key").write_bytes(fronttls._pem_key(key))
            self.drain[pair] = d / "drain.conf"
            self.drain[pair].write_text(endpoint.drain_text(False))
            self.fronts[pair] = Front(d, s, tls=(d / "front.crt", d / "front.key"),
                                      edit=self._edit(pair, s))  # fmt: skip

    def _edit(self, pair: str, s: Settings) -> Any:
        def edit(site: str) -> str:
            p = front.front_paths(s)
            site = site.replace(p["tls_ca"], str(self.ca))
            site = site.replace(endpoint.drain_include(s), str(self.drain[pair]))
            engine = f"server 127.0.0.1:{s.knobs.engine_port};"
            site = site.replace(engine, f"server 127.0.0.1:{self.engines[pair].port};")
            own = f"server 127.0.0.1:{self.api} "
            site = site.replace(own, f"server {LOOPBACK[pair]}:{self.api} ")
            listen = f"listen {self.api} ssl default_server;"
            return site.replace(
                listen,
                f"listen {LOOPBACK[pair]}:{self.api} ssl default_server;\n"
                f"    listen {LAN[pair]}:{self.api} ssl;",
            )

        return edit

    def ask(
        self, pair: str, path: str = "/v1/chat/completions", pinned: bool = False,
        key: str | None = f"Bearer {KEY}",
    ) -> tuple[int, str, str]:  # fmt: skip
        """(status, the pair that answered per the engine, the front's X-Sparkrig-Pair)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.check_hostname = False
        conn = http.client.HTTPSConnection(LAN[pair], self.api, timeout=15, context=ctx)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = key
        if pinned:
            headers[endpoint.LOCAL_HEADER] = endpoint.PINNED
        method = "GET" if path == "/health" else "POST"
        conn.request(method, path, body=None if method == "GET" else b"{}", headers=headers)
        resp = conn.getresponse()
        body = resp.read().decode()
        conn.close()
        served = json.loads(body).get("pair", "") if resp.status == 200 else ""
        return resp.status, served, resp.getheader(endpoint.PAIR_HEADER) or ""

    def set_drained(self, pair: str, drained: bool) -> None:
        self.drain[pair].write_text(endpoint.drain_text(drained))
        self.fronts[pair].reload()

    def close(self) -> None:
        for f in self.fronts.values():
            f.stop()
        for e in self.engines.values():
            e.close()


@pytest.fixture
def pairs(tmp_path: Path) -> Iterator[Endpoint]:
    ep = Endpoint(tmp_path)
    yield ep
    ep.close()


def test_either_head_balances_over_both_pairs_and_the_answer_names_its_pair(
    pairs: Endpoint,
) -> None:
    for head in ("pair_a", "pair_b"):
        answers = [pairs.ask(head) for _ in range(12)]
        assert {status for status, _, _ in answers} == {200}
        assert {served for _, served, _ in answers} == {"pair_a", "pair_b"}, answers
        assert all(served == named for _, served, named in answers), answers
    status, _, _ = pairs.ask("pair_a", key=None)
    assert status == 401  # the key is judged by the front the client dialled
    assert {pairs.ask("pair_b", "/health")[0] for _ in range(4)} == {200}


def test_a_pair_whose_engine_is_gone_gets_no_request_and_no_client_sees_a_failure(
    pairs: Endpoint,
) -> None:
    pairs.engines["pair_b"].close()
    for head in ("pair_a", "pair_b"):
        answers = [pairs.ask(head) for _ in range(8)]
        assert answers == [(200, "pair_a", "pair_a")] * 8, answers


def test_a_drained_pair_gets_no_balanced_request_but_answers_its_own_gates(
    pairs: Endpoint,
) -> None:
    pairs.set_drained("pair_b", True)
    pairs.engines["pair_b"].seen.clear()
    for head in ("pair_a", "pair_b"):
        answers = [pairs.ask(head) for _ in range(8)]
        assert answers == [(200, "pair_a", "pair_a")] * 8, answers
    assert pairs.engines["pair_b"].seen == []
    assert pairs.ask("pair_b", pinned=True) == (200, "pair_b", "pair_b")  # the gates' way
    assert pairs.ask("pair_b", "/health", pinned=True)[:2] == (200, "pair_b")
    pairs.set_drained("pair_b", False)
    # the other front tries a pair it saw refuse again after endpoint.FAIL_S: back by then
    deadline, served = time.monotonic() + endpoint.FAIL_S + 10, set()
    while served != {"pair_a", "pair_b"} and time.monotonic() < deadline:
        status, pair, _ = pairs.ask("pair_a")
        assert status == 200
        served.add(pair)
        time.sleep(0.2)
    assert served == {"pair_a", "pair_b"}


def test_a_pinned_request_stays_on_the_pair_of_the_head_it_dialled(pairs: Endpoint) -> None:
    for head in ("pair_a", "pair_b"):
        assert [pairs.ask(head, pinned=True)[1] for _ in range(6)] == [head] * 6

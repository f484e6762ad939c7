"""The release's soak gate: a new release (or the first) is held under concurrent load on the
head (``sparkhost soak``, files/sparkhost/soak.py) for ``soak_minutes`` after the gates and the
bench gate, judged by the watchdog's own rule on the engine's counters; a wedge, a failed
request or a minute under ``soak_floor`` of the first fails it naming the minute, and an upgrade
so failed rolls back like a failed gate. Its figure (requests, tokens, tok/s, p50/p99 latency,
stalls) is kept with the release (sparkrig/release.py).

Why 30 minutes and 4 streams by default: on two Sparks, TP=2, pip's NCCL 2.28.9 wedged after
20-26 minutes of 4-way concurrent load, and a 60-minute soak proved the fix
(vllm-project/vllm#42354, #41725); the gates and the short bench last seconds."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from pyinfra.api import QuoteString, operation
from pyinfra.context import ctx_state

from sparkrig import engines, hostpkg
from sparkrig.config.model import Settings
from sparkrig.factlines import last_json
from sparkrig.front import api_key_file, loopback_tls
from sparkrig.gates import LoopbackTls, local_url
from sparkrig.helperunits import progress_url
from sparkrig.runscope import once_per_run
from sparkrig.shown import ShownCommand


def soak_command(s: Settings) -> list[str]:
    """argv of the soak on the head: through the API front (as clients reach it), the engine's
    counters on its loopback port."""
    k, tls = s.knobs, loopback_tls(s)
    key = api_key_file(s)
    return hostpkg.command(
        k.install_dir, "soak",
        "--url", local_url(k.api_port, tls), *(tls.args() if isinstance(tls, LoopbackTls) else []),
        "--model", k.served_model_name,
        "--metrics-url", progress_url(s), "--parser", engines.progress_parser(s.stack),
        "--minutes", f"{k.soak_minutes:g}", "--streams", str(k.soak_streams),
        "--stall-s", str(k.watchdog_stall_s), "--floor", f"{k.soak_floor:g}",
        *(["--api-key-file", key] if key else []),
    )  # fmt: skip


def parse_soak(output: str) -> dict[str, Any]:
    """The soak's last JSON line; ``{"ok": False, "detail": ...}`` when it printed none."""
    got = last_json(output)
    if got is not None:
        return got
    return {"ok": False, "detail": output.strip()[-300:] or "no answer from sparkhost soak"}


def figure_of(result: dict[str, Any]) -> dict[str, Any]:
    """What the release keeps of a soak that held."""
    keys = ("minutes", "streams", "requests", "failed", "tokens", "tok_s", "p50_s", "p99_s")
    return {k: result[k] for k in (*keys, "stalls") if result.get(k) is not None}


def soak_text(result: dict[str, Any]) -> str:
    """``soak 30 min x 4 streams: 1210 requests, 77440 tokens (43.0 tok/s), p50 5.6 s, ...``."""
    p50, p99 = result.get("p50_s"), result.get("p99_s")
    lat = f"p50 {p50:g} s, p99 {p99:g} s" if p50 is not None and p99 is not None else "no answer"
    return (
        f"soak {result.get('minutes', 0):g} min x {result.get('streams', 0)} streams: "
        f"{result.get('requests', 0)} requests ({result.get('failed', 0)} failed), "
        f"{result.get('tokens', 0)} tokens ({result.get('tok_s', 0):g} tok/s), {lat}, "
        f"{result.get('stalls', 0)} stalls"
    )


class SoakFigures:
    """The soak operation of each host in this run (it acts on the head alone), read once it ran."""

    def __init__(self) -> None:
        self._metas: dict[str, Any] = {}

    def watch(self, host_name: str, meta: Any) -> Any:
        self._metas[host_name] = meta
        return meta

    def figure_of(self, head: str) -> Callable[[], dict[str, Any] | None]:
        """What a rank's release record calls when it runs: the soak's figure on ``head`` when
        it ran and held; else None (it did not run in this run, or failed: a failure decides
        the rollback)."""

        def figure() -> dict[str, Any] | None:
            meta = self._metas.get(head)
            if meta is None or not meta.is_complete() or not meta.did_succeed():
                return None
            if not meta.executed:
                return None
            result = parse_soak(meta.stdout)
            return figure_of(result) if result.get("ok") else None

        return figure


def soak_figures() -> SoakFigures:
    return once_per_run("soak-figures", ctx_state.get(), SoakFigures)


@operation(is_idempotent=False)
def release_soak_held(command: list[str]) -> Generator[Any, None, None]:
    """
    Hold the new release under concurrent load (the head), its progress shown a line a minute;
    fail naming the minute it wedged, failed a request or fell under the floor.

    + command: ``soak_command``'s argv
    """
    yield ShownCommand(*[QuoteString(a) for a in command])

"""The release gate's short bench on @fake hosts: no head answers HTTP here, so the child
process (sparkrig/benchgate.py ``run_short_bench``) is replaced by canned results, and every call
is kept (``CALLS``) so a test can say whether the bench ran and against what."""

from __future__ import annotations

from typing import Any

from sparkrig import benchgate


def result(single: float = 30.0, four: float = 80.0, tool: bool = True, fffd: float = 0.0,
           errors: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """A short bench's JSON as `python3 -m sparkrig.bench --short --json` writes it."""
    return {
        "schema": "sparkrig-bench/1", "single_stream_tok_s": single,
        "decode_tok_s": {"1": single, "4": four}, "tool_call_ok": tool,
        "fffd_per_10k_chars": fffd, "fffd_count": 0, "fffd_chars": 3000,
        "prefill": [], "errors": list(errors), "json_path": ".sparkrig/bench/fake.json",
    }  # fmt: skip


CALLS: list[benchgate.Target] = []
# answered in turn, the last one again for every run after it (one answer: every run of the
# gate's bench_gate_runs measures it); empty: the default result()
ANSWERS: list[dict[str, Any]] = []


def answer(*results: dict[str, Any]) -> None:
    ANSWERS[:] = list(results)


def fake_run(target: benchgate.Target, timeout_s: int) -> dict[str, Any]:
    CALLS.append(target)
    if not ANSWERS:
        return result()
    return ANSWERS.pop(0) if len(ANSWERS) > 1 else dict(ANSWERS[0])


def stub(monkeypatch: Any) -> None:
    CALLS.clear()
    ANSWERS.clear()
    monkeypatch.setattr(benchgate, "run_short_bench", fake_run)

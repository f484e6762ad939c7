"""The fabric's all-reduce bus bandwidth on the control side.

Each rank's NCCL smoke test (files/sparkhost/nccl_smoke.py, run by tasks/smoke.py) ends its
output with one JSON line; the job itself fails a rank below ``fabric_busbw_min_gbs`` or off
NET/IB, which stops the deploy before the pair starts. What passed is read here, typed
(``sparkhost.nccl_smoke.SmokeResult``: busbw, algbw, bytes, iters, transport), from the
operation's output once it ran, and kept with the release on that rank (sparkrig/release.py
``record_stamped``); status.py shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra.context import ctx_state
from sparkhost.nccl_smoke import SmokeResult, parse_result

from sparkrig.runscope import once_per_run


class SmokeFigures:
    """The smoke-test operation of each host in this run, read once it ran."""

    def __init__(self) -> None:
        self._metas: dict[str, Any] = {}
        self._functions: dict[str, dict[str, Any]] = {}

    def watch(self, host_name: str, meta: Any) -> Any:
        self._metas[host_name] = meta
        return meta

    def watch_function(self, host_name: str, rdma: str, meta: Any) -> Any:
        """The smoke test of one function of a pair's cable alone (its RDMA device)."""
        self._functions.setdefault(host_name, {})[rdma] = meta
        return meta

    def result(self, host_name: str) -> SmokeResult | None:
        """The host's smoke-test line when its operation ran and passed; else None (it did not
        run in this run, has not run yet, or failed: a failure stops the run anyway)."""
        return _passed(self._metas.get(host_name))

    def figure_of(self, host_name: str) -> Callable[[], dict[str, Any] | None]:
        """What an operation calls when it runs: the figure measured on ``host_name`` with each
        function's alone (``function.<RDMA device>``: its busbw), or None."""

        def figure() -> dict[str, Any] | None:
            result = self.result(host_name)
            if result is None or (out := result.figure()) is None:
                return None
            for rdma, meta in self._functions.get(host_name, {}).items():
                alone = _passed(meta)
                if alone is not None and alone.busbw_gbs is not None:
                    out[f"{FUNCTION_KEY}{rdma}"] = alone.busbw_gbs
            return out

        return figure


FUNCTION_KEY = "function."  # a kept figure's key of one function's busbw: function.<RDMA device>


def _passed(meta: Any) -> SmokeResult | None:
    if meta is None or not meta.is_complete() or not meta.did_succeed():
        return None
    return parse_result(meta.stdout_lines)


def smoke_figures() -> SmokeFigures:
    """The current run's smoke-test figures (one object for every host and phase)."""
    return once_per_run("smoke-figures", ctx_state.get(), SmokeFigures)


def figure_text(fabric: dict[str, Any] | None) -> str:
    """A kept figure as status.py prints it: ``busbw 21.4 GB/s (NET/IB, 256 MiB x 20; alone:
    rocep1s0f1 11.9, roceP2p1s0f1 12.0 GB/s)``."""
    if not fabric or not isinstance(fabric.get("busbw_gbs"), (int, float)):
        return "busbw -"
    how = []
    if fabric.get("transport"):
        how.append(f"NET/{fabric['transport']}")
    if isinstance(fabric.get("bytes"), int) and isinstance(fabric.get("iters"), int):
        how.append(f"{fabric['bytes'] / 2**20:g} MiB x {fabric['iters']}")
    functions = [
        f"{key.removeprefix(FUNCTION_KEY)} {value:.1f}"
        for key, value in sorted(fabric.items())
        if key.startswith(FUNCTION_KEY) and isinstance(value, (int, float))
    ]
    alone = f"; alone: {', '.join(functions)} GB/s" if functions else ""
    return f"busbw {fabric['busbw_gbs']:.1f} GB/s" + (
        f" ({', '.join(how)}{alone})" if how else alone
    )

"""Stand-in for `tensorfold serve` in the lab: TensorFold 0.6.0 as MiaAI's v1.10 image runs it.

Stdlib only; shipped beside lab/standin_vllm.py (whose HTTP, rendezvous and timed engine it
reuses) in the lab's stand-in images, run by the image's ``/usr/local/bin/tensorfold`` wrapper.
It answers only in the image of the ``tensorfold-0.6`` flavour ($SPARKRIG_STANDIN_ENGINE, the
`tensorfold` stack's stand-in) or of ``tensorfold-tp4`` (the `tensorfold-ring` stack's: MiaAI's
N-rank build, whose patches 0066-0068 let ``--tp`` take 3 and 4 and ``--rank`` 2 and 3: research
tensorfold.md, "`tensorfold serve` CLI"; the patches themselves are not in the stored sources);
in any other image there is no TensorFold (exit 127, as a shell finding no such command). What it
mirrors, with the source read:

- The CLI (ashhart/TensorFold src/tensorfold/cli_args.py@0b3f3bbb, lab/tensorfold-flags.txt):
  ``tensorfold serve MODEL [options]``; an option the list lacks, or a second positional, stops
  it with argparse's "tensorfold: error: unrecognized arguments: ..." and exit 2; ``--tp`` takes 1
  or 2 and ``--rank`` 0 or 1 (argparse's "invalid choice", exit 2). The stand-in's own knobs
  (``--standin-*``, lab/standin_engine.py) are accepted too.
- Ranks: rank 0 serves the TCP store on ``--master:--master-port`` (default 29551) and, once every
  rank joined and "loaded", HTTP on ``--host:--port`` (defaults 127.0.0.1:8080); rank >= 1 joins
  the store, says "ready ... following rank 0" and **never opens HTTP**. A rank whose peer goes
  away: a worker exits 1; rank 0 keeps answering /health and /v1/models while every request hangs
  (TensorFold 0.6.0 has no peer watch: MiaAI issue #129, patch 0115 unreleased), the state the
  watchdog must catch. SIGUSR1 wedges rank 0 as in the vLLM stand-in.
- No API key of its own (0.6.0 has none): every route answers without one; sparkrig's front holds
  the key.
- ``GET /health``: the JSON of src/tensorfold/cuda/health.py@01ecc8dc (Health.snapshot):
  ``ok``, ``backend: "tensorfold"``, ``busy``, ``requests_running``, ``requests_total``,
  ``prompt_tokens_total``, ``completion_tokens_total`` (tokens of running replies included) and
  the stats totals; frozen by a wedge. ``GET /metrics``: the ``tensorfold:`` names of
  src/tensorfold/server/metrics.py@01ecc8dc (``tensorfold:requests_running``, ``_waiting``,
  ``tensorfold:prompt_tokens_total``, ``tensorfold:generation_tokens_total``, and the vLLM-named
  mirror ``tensorfold:num_requests_running``); no ``vllm:`` names. The stand-in counts a prompt
  when its first token comes out, TensorFold when the request finishes.
- The model directory must hold config.json; ``--drafter`` other than auto/none must be a
  directory holding config.json (the mounted DFlash2 snapshot).
- SIGTERM ends either rank at once (real ranks past 0 run as PID 1 with no SIGTERM handler, so a
  `docker stop` there waits its timeout and kills).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # shipped beside standin_vllm
import standin_engine as engine  # noqa: E402
import standin_flavour as flavours  # noqa: E402
import standin_vllm as base  # noqa: E402

FLAVOUR = flavours.TENSORFOLD
TP4 = flavours.TENSORFOLD_TP4  # the N-rank build (tensorfold-ring): the same CLI, more ranks
FLAGS_FILE = os.path.join(flavours.HERE, "tensorfold-flags.txt")
VERSION = "0.6.0+standin"
Choices = dict[str, tuple[str, ...]]  # option -> the values argparse accepts
CHOICES: Choices = {"--tp": ("1", "2"), "--rank": ("0", "1")}
CHOICES_BY_FLAVOUR: dict[str, Choices] = {
    FLAVOUR: CHOICES,
    TP4: {"--tp": ("1", "2", "3", "4"), "--rank": ("0", "1", "2", "3")},
}
USAGE = "usage: tensorfold [-h] [--version] {serve,pull,models,update,info} ..."
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def load_flags(path: str = FLAGS_FILE) -> dict[str, str]:
    """option -> nargs of `tensorfold serve` (the flag list), plus the stand-in's own knobs."""
    flags = {opt: nargs for opt, nargs in flavours._entries(path)}
    return {**base.STANDIN_FLAGS, **flags}


def usage_error(msg: str, prog: str = "tensorfold") -> SystemExit:
    print(USAGE, file=sys.stderr)
    print(f"{prog}: error: {msg}", file=sys.stderr, flush=True)
    return SystemExit(2)


def parse(
    argv: list[str],
    flags: dict[str, str] | None = None,
    choices: Choices = CHOICES,
) -> base.Options:
    """``serve MODEL --flag value ...`` read by the flag list (no abbreviations: the tests pass
    full names); unknown options and extra positionals refused as argparse refuses them."""
    flags = load_flags() if flags is None else flags
    opts = base.parse_args(argv, flags)
    if opts.unknown:
        raise usage_error(f"unrecognized arguments: {' '.join(opts.unknown)}")
    for flag, allowed in choices.items():
        v = opts.values.get(flag)
        if v is not None and v not in allowed:
            said = ", ".join(allowed)
            raise usage_error(
                f"argument {flag}: invalid choice: {v} (choose from {said})", "tensorfold serve"
            )
    return opts


def as_vllm(opts: base.Options) -> base.Options:
    """The same options under the names the vLLM stand-in's machinery reads."""
    out = base.Options()
    out.model, out.switches = opts.model, set(opts.switches)
    out.values = {k: v for k, v in opts.values.items() if k.startswith("--standin-")}
    rank = int(opts.values.get("--rank", "0"))
    name = opts.values.get("--name") or os.path.basename(opts.model.rstrip("/"))
    out.values.update({
        "--nnodes": opts.values.get("--tp", "1"),
        "--node-rank": str(rank),
        "--master-addr": opts.values.get("--master") or "127.0.0.1",
        "--master-port": opts.values.get("--master-port", "29551"),
        "--host": opts.values.get("--host", "127.0.0.1"),
        "--port": opts.values.get("--port", "8080"),
        "--served-model-name": name,
    })  # fmt: skip
    if opts.values.get("--context", "0") != "0":
        out.values["--max-model-len"] = opts.values["--context"]
    if (opts.values.get("--parallel") or "").isdigit():
        out.values["--max-num-seqs"] = opts.values["--parallel"]
    if rank > 0:
        out.switches.add("--headless")
    return out


def health_body(counts: dict[str, int]) -> dict[str, Any]:
    """Health.snapshot's JSON (health.py@01ecc8dc), from the stand-in engine's counters."""
    running = counts["running"]
    return {
        "ok": True, "backend": "tensorfold", "busy": running > 0, "requests_running": running,
        "requests_total": max(0, counts["served"] - running),
        "prompt_tokens_total": counts["prompt"], "completion_tokens_total": counts["generation"],
        "prefill_seconds_total": 0.0, "decode_seconds_total": 0.0, "cached_tokens_total": 0,
        "rounds_total": 0, "drafted_total": 0, "accepted_total": 0,
    }  # fmt: skip


def metrics_text(counts: dict[str, int]) -> str:
    """The `tensorfold:` families progress is read from (metrics.py@01ecc8dc render)."""
    lines: list[str] = []
    for name, kind, value in (
        ("requests_running", "gauge", counts["running"]),
        ("requests_waiting", "gauge", counts["waiting"]),
        ("prompt_tokens_total", "counter", counts["prompt"]),
        ("generation_tokens_total", "counter", counts["generation"]),
        ("num_requests_running", "gauge", counts["running"]),
        ("num_requests_waiting", "gauge", counts["waiting"]),
    ):
        full = f"tensorfold:{name}"
        lines += [f"# HELP {full} (stand-in)", f"# TYPE {full} {kind}", f"{full} {value}"]
    return "\n".join(lines) + "\n"


class Peers(base.Peers):
    """Rank 0's view of its peers: a lost one does not make the engine answer 500, as vLLM's
    does; TensorFold 0.6.0 takes the request and it never finishes (the wedge)."""

    @property
    def dead(self) -> bool:
        return False


class Handler(base.Handler):
    """The vLLM stand-in's routes with TensorFold's /health, /metrics and /v1/models."""

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        eng = self.server.engine
        if path == "/health":
            self._send(200, health_body(eng.counts()))
        elif path == "/metrics":
            self._send(200, metrics_text(eng.counts()).encode(), PROMETHEUS)
        elif path == "/v1/models":
            model = {"id": eng.served_name, "object": "model", "owned_by": "tensorfold",
                     "context_length": eng.knobs.max_model_len}  # fmt: skip
            self._send(200, {"object": "list", "data": [model]})
        else:
            super().do_GET()


def check_files(opts: base.Options, drafter: str | None) -> None:
    if not opts.model:
        base.fail("tensorfold serve: error: the following arguments are required: model", 2)
    if not os.path.isfile(os.path.join(opts.model, "config.json")):
        base.fail(f"model directory {opts.model} has no config.json (weights not mounted?)")
    if drafter not in (None, "auto", "none") and not os.path.isfile(
        os.path.join(str(drafter), "config.json")
    ):
        base.fail(f"drafter {drafter} is not a model directory (no config.json)")


def run_worker(opts: base.Options, timeout: float) -> int:
    sock = base.worker_connect(opts, timeout)
    stop = threading.Event()
    threading.Thread(target=base._heartbeat, args=(sock, stop), daemon=True).start()
    base.stage(opts, f"rank {opts.rank}: loading {opts.model}")
    base.log(f"rank {opts.rank}: ready (tp {opts.nnodes}), following rank 0")
    why = base._watch(sock)
    base.fail(f"rank {opts.rank}: rank 0 went away ({why}); exiting")
    return 1


def run_head(opts: base.Options, timeout: float) -> int:
    knobs = engine.knobs_from(
        opts.get,
        max_num_seqs=opts.num("--max-num-seqs", 1),  # CUDA's --parallel auto: one at a time
        max_model_len=opts.num("--max-model-len", 262144),
        batched_tokens=engine.DEFAULT_BATCHED_TOKENS,
    )
    eng = engine.Engine(knobs, opts.served_name)
    signal.signal(signal.SIGUSR1, lambda *_: eng.wedge())
    peers = Peers(opts.nnodes - 1)

    def on_lost(rank: int, why: str) -> None:
        # 0.6.0 has no peer watch: rank 0 stays up, /health says ok, every request hangs
        base.log(f"rank {rank} lost ({why}); rank 0 keeps serving, requests hang", "ERROR")
        if "--standin-exit-on-peer-loss" in opts.switches:
            os._exit(1)
        eng.wedge()

    if peers.expected > 0:
        srv = base.head_rendezvous(opts, peers, on_lost)
        if not peers.wait_all(timeout):
            srv.close()
            base.fail(f"rendezvous timed out after {timeout:.0f} s: {len(peers.joined)} of "
                      f"{peers.expected} rank(s) joined")  # fmt: skip
    base.stage(opts, f"loading {opts.model} (tp {opts.nnodes})")
    host, port = opts.get("--host") or "127.0.0.1", opts.num("--port", 8080)
    api = base.Api((host, port), Handler)
    api.opts, api.peers, api.tokens, api.engine = opts, peers, [], eng  # no key: 0.6.0 has none
    base.log(f"TensorFold {VERSION} serving {opts.served_name} at http://{host}:{port}")
    print("INFO:     Application startup complete.", flush=True)
    try:
        api.serve_forever()
    finally:
        api.server_close()
    return 0


def run(argv: list[str], environ: Any = os.environ) -> int:
    choices = CHOICES_BY_FLAVOUR.get(environ.get(flavours.ENV, ""))
    if choices is None:
        print("sh: 1: tensorfold: not found", file=sys.stderr)
        return 127
    if argv[:1] == ["--version"]:
        print(f"tensorfold {VERSION}")
        return 0
    if argv[:1] != ["serve"]:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        opts = parse(argv, choices=choices)
    except SystemExit as exc:
        return int(exc.code or 0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    check_files(opts, opts.values.get("--drafter"))
    vopts = as_vllm(opts)
    timeout = float(vopts.get("--standin-rendezvous-timeout") or 600)
    base.log(f"tensorfold serve {opts.model}: tp {vopts.nnodes}, rank {vopts.rank} (stand-in)")
    if vopts.headless:
        return run_worker(vopts, timeout)
    return run_head(vopts, timeout)


def main() -> int:
    base.map_nccl()
    try:
        return run(sys.argv[1:])
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

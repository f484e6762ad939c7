"""The drafter over a bench run: its acceptance from the engine's /metrics, and which drafter
files it was (the drafter lockfile's digest).

vLLM exposes speculative decoding's counters only when it serves with a --speculative-config
(vLLM 0.33 ``vllm/v1/spec_decode/metrics.py`` ``SpecDecodingProm``, registered by
``vllm/v1/metrics/loggers.py`` with the labels model_name and engine); prometheus_client writes
each counter with its ``_total`` suffix. The acceptance is that module's own PromQL over the
run: accepted / draft tokens (what vLLM logs as "Avg Draft acceptance rate"), and the mean
acceptance length 1 + accepted / drafts (its "Mean acceptance length", the bonus token
included: the tokens a verify step emits). /metrics is read before the run and after it, through
the same front, key and CA as the requests; the figures are the difference, so whatever the
engine served before the run does not count (another client's requests during the run do).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from .client import Endpoint

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED)


def counters(text: str) -> dict[str, float]:
    """The spec-decode counters of a /metrics text, each summed over its label sets (one per
    engine); a counter the text does not hold is absent."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name not in COUNTERS:
            continue
        value = rest.rpartition("}")[2] if "}" in rest else rest
        try:
            out[name] = out.get(name, 0.0) + float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return out


@dataclass
class Reading:
    """/metrics at one moment: its counters, or why there are none."""

    counts: dict[str, float] = field(default_factory=dict)
    why: str = ""


def read(ep: Endpoint) -> Reading:
    try:
        r = requests.get(ep.url + "/metrics", headers=ep._headers(), timeout=30.0,
                         verify=ep.verify)  # fmt: skip
    except requests.RequestException as exc:
        return Reading(why=f"/metrics did not answer ({type(exc).__name__})")
    if r.status_code != 200:
        return Reading(why=f"/metrics answered HTTP {r.status_code}")
    found = counters(r.text)
    if set(found) != set(COUNTERS):
        return Reading(found, "no spec-decode counters on /metrics (vllm:spec_decode_num_*: "
                       "an engine without a --speculative-config, or not vLLM)")  # fmt: skip
    return Reading(found)


def over(before: Reading, after: Reading) -> dict[str, Any]:
    """The run's figures: ``spec_acceptance`` (accepted / draft tokens), ``spec_acceptance_length``
    (1 + accepted / drafts), and ``spec_decode`` with the counts, or a note saying why they are
    None."""
    why = before.why or after.why
    d = {name: after.counts.get(name, 0.0) - before.counts.get(name, 0.0) for name in COUNTERS}
    if not why and any(v < 0 for v in d.values()):
        why = "the spec-decode counters went back (the engine restarted during the run)"
    if not why and d[DRAFT_TOKENS] <= 0:
        why = "no draft tokens during the run"
    if why:
        return {"spec_acceptance": None, "spec_acceptance_length": None,
                "spec_decode": {"note": why}}  # fmt: skip
    return {
        "spec_acceptance": round(d[ACCEPTED] / d[DRAFT_TOKENS], 4),
        "spec_acceptance_length": round(1 + d[ACCEPTED] / d[DRAFTS], 3) if d[DRAFTS] else None,
        "spec_decode": {"drafts": int(d[DRAFTS]), "draft_tokens": int(d[DRAFT_TOKENS]),
                        "accepted_tokens": int(d[ACCEPTED]), "source": "/metrics"},
    }  # fmt: skip


def drafter_identity(path: str | Path) -> dict[str, Any]:
    """Which drafter files a run measured, from the drafter's lockfile (sparkrig/lockfile.py: the
    repo at a commit, every file with its sha256): its repo and commit, the lockfile's own
    sha256 (one digest over every file's hash) and each safetensors file's sha256 (the figure
    users compare, e.g. model.safetensors). OSError or ValueError when it is no lockfile."""
    data = Path(path).read_bytes()
    lock = json.loads(data)
    if not isinstance(lock, dict) or not isinstance(lock.get("files"), list):
        raise ValueError(f"{path}: not a lockfile (no files list)")
    weights = {str(f["path"]): str(f["sha256"]) for f in lock["files"]
               if isinstance(f, dict) and str(f.get("path", "")).endswith(".safetensors")
               and f.get("sha256")}  # fmt: skip
    return {
        "repo": lock.get("repo"),
        "commit": lock.get("commit"),
        "lockfile": str(path),
        "lockfile_sha256": hashlib.sha256(data).hexdigest(),
        "weights_sha256": weights,
    }

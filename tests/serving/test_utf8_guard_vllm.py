"""The UTF-8 guard loaded and driven through the real vLLM package (requirements-vllm.txt): its V2
loader and RequestState, its V1 loader and BatchUpdate, real SamplingParams and VllmConfig."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import REPO
from test_utf8_guard import EOS, PLAIN, TOK, tid
from vllm_helpers import commit, request_states, vllm_cpu

FQCN = "utf8_guard_lp:Utf8GuardLogitsProcessor"
VOCAB = PLAIN + 1 + 3  # the model's vocabulary is padded past the tokenizer's ids
FRAG = tid(b"\xe6\xb8")  # 測 without its last byte
CONT_OK = {b for b in range(0x80, 0xC0)} | {tid(b"\xac\xe5\xae"), tid(b"\x84 ok")}


@pytest.fixture(scope="module")
def guard_env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    vllm_cpu()
    tok = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.write_text(json.dumps(TOK))
    mp = pytest.MonkeyPatch()
    mp.setenv("SPARKRIG_UTF8_GUARD_TOKENIZER", str(tok))
    mp.syspath_prepend(str(REPO / "files"))  # as the image puts utf8_guard_lp on PYTHONPATH
    sys.modules.pop("utf8_guard_lp", None)
    from vllm.config import VllmConfig

    yield VllmConfig()
    mp.undo()


def _params(**extra: Any) -> Any:
    from vllm.sampling_params import SamplingParams

    return SamplingParams(max_tokens=64, extra_args=extra or None)


def _ctx(slots: list[int]) -> Any:
    import numpy as np
    import torch
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

    idx = torch.tensor(slots, dtype=torch.int32)
    return LogitsContext(
        expanded_idx_mapping=idx,
        idx_mapping=idx,
        idx_mapping_np=np.array(slots, dtype=np.int32),
        expanded_local_pos=torch.zeros(len(slots), dtype=torch.int32),
        input_ids=torch.zeros(len(slots), dtype=torch.int32),
        pos=torch.zeros(len(slots), dtype=torch.int32),
        seq_lens_upper_bound_np=np.zeros(len(slots), dtype=np.int32),
    )


def _v2_guard(vllm_config: Any, max_reqs: int = 4) -> tuple[Any, Any]:
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsProcessor,
        build_custom_logits_processors,
        build_custom_logits_processors_params_validator,
    )

    rs = request_states(max_reqs, 1024, VOCAB)
    procs = build_custom_logits_processors(vllm_config, rs, False, [FQCN])
    assert len(procs) == 1 and isinstance(procs[0], LogitsProcessor)
    build_custom_logits_processors_params_validator([FQCN])(_params())  # the frontend's load
    return procs[0], rs


def _add(rs: Any, proc: Any, req_id: str, prompt: list[int], params: Any) -> int:
    rs.add_request(req_id, len(prompt), prompt, 0, 64)
    slot = rs.req_id_to_index[req_id]
    commit(rs, slot, prompt)
    proc.add_request(slot, params)
    return slot


def test_v2_loader_builds_and_masks_from_request_history(guard_env: Any) -> None:
    import torch

    proc, rs = _v2_guard(guard_env)
    prompt = [tid(b"hello"), FRAG]  # a prompt ending mid-character does not count: output does
    a = _add(rs, proc, "a", prompt, _params())
    b = _add(rs, proc, "b", prompt, _params())
    c = _add(rs, proc, "c", prompt, _params(utf8_guard=False))
    commit(rs, b, [*prompt, FRAG])  # b's output so far: a fragment
    commit(rs, c, [*prompt, FRAG])
    slots = [c, a, b]  # rows are not slots
    logits = torch.zeros(3, VOCAB)
    logits[:, ord("a")] = 10.0
    out = proc.apply(logits, _ctx(slots))
    row_a, row_b, row_c = out[1], out[2], out[0]
    assert row_a[ord("a")] == 10.0 and torch.isinf(row_a[0xAC])  # boundary: no continuation
    assert torch.isinf(row_a[PLAIN + 1 :]).all()  # padding ids past the tokenizer
    assert torch.isinf(row_b[ord("a")]) and torch.isinf(row_b[EOS])  # mid-character
    assert int(row_b.argmax()) in CONT_OK
    assert torch.isfinite(row_c).all()  # opted out
    # the next step: b got its continuation, a a fragment
    commit(rs, b, [*prompt, FRAG, 0xAC])
    commit(rs, a, [*prompt, tid(b"\xe7\xaf")])
    out = proc.apply(torch.zeros(3, VOCAB), _ctx(slots))
    assert torch.isinf(out[1, ord("a")]) and out[1, 0x84] == 0.0
    assert out[2, ord("a")] == 0.0 and torch.isinf(out[2, 0x84])


def test_v2_slot_reuse_resets_state(guard_env: Any) -> None:
    import torch

    proc, rs = _v2_guard(guard_env, max_reqs=1)
    slot = _add(rs, proc, "old", [1], _params())
    commit(rs, slot, [1, FRAG])
    assert torch.isinf(proc.apply(torch.zeros(1, VOCAB), _ctx([slot]))[0, ord("a")])
    rs.remove_request("old")
    assert _add(rs, proc, "new", [1, 2, 3], _params()) == slot
    out = proc.apply(torch.zeros(1, VOCAB), _ctx([slot]))
    assert out[0, ord("a")] == 0.0 and torch.isinf(out[0, 0xAC])


@pytest.mark.parametrize("seed", [0, 1])
def test_v2_random_walk_stays_valid_utf8(guard_env: Any, seed: int) -> None:
    import torch
    from utf8_guard_lp import token_bytes_from_tokenizer_json

    proc, rs = _v2_guard(guard_env, max_reqs=3)
    tb = token_bytes_from_tokenizer_json(TOK)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    live: dict[str, list[int]] = {}
    done: list[list[int]] = []
    for step in range(400):
        while len(live) < 3:  # requests come and go: slots are reused
            rid = f"r{step}-{len(live)}"
            _add(rs, proc, rid, [ord("x")], _params())
            live[rid] = [ord("x")]
        slots = [rs.req_id_to_index[r] for r in live]
        rng.shuffle(slots)
        logits = torch.randn(len(slots), VOCAB, generator=gen) * 3
        probs = torch.softmax(proc.apply(logits, _ctx(slots)), dim=-1)
        picks = torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()
        for slot, pick in zip(slots, picks, strict=True):
            rid = rs.index_to_req_id[slot]
            live[rid].append(int(pick))
            commit(rs, slot, live[rid])
        if step % 37 == 36:
            rid = rng.choice(list(live))
            done.append(live.pop(rid)[1:])
            rs.remove_request(rid)
    assert len(done) >= 8
    for out in done:  # a request removed mid-walk may end mid-character, never break inside
        _decode_prefix(b"".join(tb[t] or b"" for t in out))


def _decode_prefix(data: bytes) -> str:
    """Decode, allowing only an unfinished last character (the walk stops mid-stream)."""
    for cut in range(4):
        try:
            return data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError(f"invalid UTF-8 inside the output: {data!r}")


def test_v2_loader_rejects_a_v1_only_processor(guard_env: Any) -> None:
    """Why the guard subclasses both: V2's loader refuses a V1-only class (the old guard)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1
    from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors

    class V1Only(V1):
        pass

    with pytest.raises(ValueError, match="not a subclass"):
        build_custom_logits_processors(guard_env, request_states(1, 8, VOCAB), False, [V1Only])


def test_v1_loader_builds_and_masks(guard_env: Any) -> None:
    import torch
    from vllm.v1.sample.logits_processor import (
        BatchUpdate,
        LogitsProcessor,
        MoveDirectionality,
        build_logitsprocs,
    )

    procs = build_logitsprocs(guard_env, torch.device("cpu"), False, False, [FQCN])
    ours = [p for p in procs.all if type(p).__name__ == "Utf8GuardLogitsProcessor"]
    assert len(ours) == 1 and isinstance(ours[0], LogitsProcessor)
    assert ours[0] in procs.non_argmax_invariant
    proc = ours[0]
    out0: list[int] = []
    out1: list[int] = [FRAG]
    off: list[int] = [FRAG]
    proc.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[],
            added=[
                (0, _params(), [1], out0),
                (1, _params(), [1], out1),
                (2, _params(utf8_guard=False), [1], off),
            ],  # fmt: skip
            moved=[],
        )
    )
    res = proc.apply(torch.zeros(3, VOCAB))
    assert torch.isinf(res[0, 0xAC]) and res[0, ord("a")] == 0.0
    assert res[1, 0xAC] == 0.0 and torch.isinf(res[1, ord("a")]) and torch.isinf(res[1, EOS])
    assert torch.isfinite(res[2]).all()
    proc.update_state(
        BatchUpdate(
            batch_size=3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]
        )  # fmt: skip
    )
    res = proc.apply(torch.zeros(3, VOCAB))
    assert res[0, 0xAC] == 0.0 and torch.isinf(res[1, 0xAC])


def test_guard_refuses_speculative_decoding(guard_env: Any) -> None:
    """SpeculativeConfig cannot be built without a model; only its token count is read."""
    import torch
    from utf8_guard_lp import Utf8GuardLogitsProcessor

    class Spec:  # the one attribute the guard reads from vllm_config.speculative_config
        num_speculative_tokens = 4

    cfg = guard_env.__class__()
    object.__setattr__(cfg, "speculative_config", Spec())
    with pytest.raises(ValueError, match="speculative"):
        Utf8GuardLogitsProcessor(cfg, torch.device("cpu"), False)


def test_guard_module_file_is_the_one_loaded(guard_env: Any) -> None:
    import utf8_guard_lp

    assert Path(utf8_guard_lp.__file__).resolve() == REPO / "files" / "utf8_guard_lp.py"

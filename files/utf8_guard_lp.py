"""UTF-8 guard: a vLLM logits processor (V1 and V2 model runners) that never lets a request's
output bytes go invalid.

GLM-5.3's byte-level BPE spells most kanji as a 2-byte fragment plus a 1-byte continuation
(測 = e6b8 + ac); the served model sometimes emits the fragment and skips the continuation, which
decodes as U+FFFD (seed 000, the Classmethod article). This processor masks, at every step and
per request:

- after a token that ends mid-character: every token that does not start with the missing
  continuation byte(s) (an exact UTF-8 automaton, so E0/ED/F0/F4 second-byte ranges are honoured);
- at a character boundary: every token that starts with a continuation byte;
- always: tokens that can never be part of valid UTF-8 (bytes C0, C1, F5..FF, a lead byte followed
  by a non-continuation inside the token, ...), and ids the tokenizer does not define.

Special tokens (EOS, tool-call markers) count as "complete" and are allowed only at a boundary, so a
request cannot stop in the middle of a character.

Layout: the pure logic (GPT-2 byte table, per-token classes, the automaton, per-request state,
allowed masks) is plain Python with no third-party import. ``Utf8GuardLogitsProcessor`` is built on
first attribute access (PEP 562 ``__getattr__``) so torch and vLLM are imported only when vLLM loads
``--logits-processors utf8_guard_lp:Utf8GuardLogitsProcessor``. A request can opt out with
``SamplingParams.extra_args = {"utf8_guard": False}``. The V1 runner refuses custom logits
processors while speculative decoding is on and the guard itself refuses it on both (under V2 a row
per draft token would need the drafts' states), so the guard profile runs without speculation.

Which runner: vLLM 0.33 picks Model Runner V2 unless VLLM_USE_V2_MODEL_RUNNER=0 or a feature V2
lacks is configured (none of sparkrig's profiles configures one: config/vllm.py
``_get_v2_model_runner_unsupported_features``), so every profile, the guard included, runs on V2
there. The default image's vLLM is an older dev build (docs/sources.md, "Image"); the class
subclasses both interfaces, so the same FQCN loads on whichever runner that build picks.

The tokenizer is read from ``$SPARKRIG_UTF8_GUARD_TOKENIZER`` (a tokenizer.json path or a directory
holding one) or else from ``vllm_config.model_config.tokenizer`` (the mounted model directory).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# --- UTF-8 automaton ---------------------------------------------------------------------------
# States are small ints; ERR marks a dead end. Names describe what the next byte must be.
ACCEPT = 0  # at a character boundary
NEED1 = 1  # one continuation byte (80..BF) missing
NEED2 = 2  # two continuation bytes missing
NEED3 = 3  # three continuation bytes missing
E0_2ND = 4  # after E0: next byte A0..BF (no overlong), then one more
ED_2ND = 5  # after ED: next byte 80..9F (no surrogates), then one more
F0_2ND = 6  # after F0: next byte 90..BF (no overlong), then two more
F4_2ND = 7  # after F4: next byte 80..8F (<= U+10FFFF), then two more
NUM_STATES = 8
ERR = 255

STATE_NAMES = ("accept", "need1", "need2", "need3", "e0", "ed", "f0", "f4")

# (low, high, next) continuation ranges for each mid-character state
_CONT: dict[int, tuple[int, int, int]] = {
    NEED1: (0x80, 0xBF, ACCEPT),
    NEED2: (0x80, 0xBF, NEED1),
    NEED3: (0x80, 0xBF, NEED2),
    E0_2ND: (0xA0, 0xBF, NEED1),
    ED_2ND: (0x80, 0x9F, NEED1),
    F0_2ND: (0x90, 0xBF, NEED2),
    F4_2ND: (0x80, 0x8F, NEED2),
}


def utf8_step(state: int, byte: int) -> int:
    """One byte through the UTF-8 automaton; returns the next state or ERR."""
    if state == ERR:
        return ERR
    if state == ACCEPT:
        if byte <= 0x7F:
            return ACCEPT
        if 0xC2 <= byte <= 0xDF:
            return NEED1
        if byte == 0xE0:
            return E0_2ND
        if byte == 0xED:
            return ED_2ND
        if 0xE1 <= byte <= 0xEF:
            return NEED2
        if byte == 0xF0:
            return F0_2ND
        if 0xF1 <= byte <= 0xF3:
            return NEED3
        if byte == 0xF4:
            return F4_2ND
        return ERR  # 80..BF lone continuation, C0/C1 overlong, F5..FF
    low, high, nxt = _CONT[state]
    return nxt if low <= byte <= high else ERR


def advance(state: int, data: bytes) -> int:
    """Run a byte string through the automaton from ``state``."""
    for b in data:
        state = utf8_step(state, b)
        if state == ERR:
            return ERR
    return state


def is_continuation(byte: int) -> bool:
    return 0x80 <= byte <= 0xBF


# --- token classes ------------------------------------------------------------------------------
COMPLETE = "complete"  # valid UTF-8 on its own (ASCII, whole characters, special tokens)
FRAGMENT = "fragment"  # starts at a boundary, ends mid-character (e6b8)
CONTINUATION = "continuation"  # starts with continuation bytes, usable only mid-character (ac)
INVALID = "invalid"  # valid from no state at all


def token_class(data: bytes | None) -> str:
    """Classify one token's bytes (None = special token)."""
    if data is None or not data:
        return COMPLETE
    end = advance(ACCEPT, data)
    if end == ACCEPT:
        return COMPLETE
    if end != ERR:
        return FRAGMENT
    if is_continuation(data[0]) and any(advance(s, data) != ERR for s in _CONT):
        return CONTINUATION
    return INVALID


# --- byte-level BPE vocabulary ------------------------------------------------------------------
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def decode_token_string(token: str, table: Mapping[str, int] | None = None) -> bytes:
    """Bytes of one byte-level BPE vocabulary string; characters outside the map are UTF-8."""
    table = table if table is not None else unicode_to_bytes()
    out = bytearray()
    for ch in token:
        b = table.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


def token_bytes_from_tokenizer_json(data: Mapping[str, Any]) -> dict[int, bytes | None]:
    """Map token id -> bytes from a parsed tokenizer.json (model.vocab plus added_tokens).

    Special added tokens map to None (no text); non-special added tokens to their UTF-8 content.
    """
    model = data.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise ValueError("tokenizer.json has no model.vocab mapping (not a BPE tokenizer?)")
    table = unicode_to_bytes()
    out: dict[int, bytes | None] = {
        int(tid): decode_token_string(tok, table) for tok, tid in vocab.items()
    }
    for added in data.get("added_tokens") or []:
        tid = int(added["id"])
        if added.get("special", False):
            out[tid] = None
        else:
            out[tid] = str(added.get("content", "")).encode("utf-8")
    return out


def load_tokenizer_json(path: str | os.PathLike[str]) -> dict[int, bytes | None]:
    """Read tokenizer.json from a file or a directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"utf8_guard: no tokenizer.json at {p}")
    with p.open(encoding="utf-8") as fh:
        return token_bytes_from_tokenizer_json(json.load(fh))


# --- the guard table ----------------------------------------------------------------------------
class GuardTable:
    """Per-token transitions for every automaton state, plus allowed masks per state.

    ``next_state[s][t]`` is the state after token ``t`` from state ``s`` (ERR = banned). Ids not in
    the vocabulary (padding up to ``vocab_size``) are banned from every state.
    """

    def __init__(self, token_bytes: Mapping[int, bytes | None], vocab_size: int | None = None):
        size = max(token_bytes, default=-1) + 1
        self.vocab_size = max(size, vocab_size or 0)
        self.next_state: list[bytearray] = [
            bytearray([ERR]) * self.vocab_size for _ in range(NUM_STATES)
        ]
        self.classes: dict[int, str] = {}
        for tid, data in token_bytes.items():
            self.classes[tid] = token_class(data)
            if data is None:  # special: only at a boundary, leaves it unchanged
                self.next_state[ACCEPT][tid] = ACCEPT
                continue
            if not data:  # empty text: changes nothing
                for s in range(NUM_STATES):
                    self.next_state[s][tid] = s
                continue
            if is_continuation(data[0]):
                for s in _CONT:
                    self.next_state[s][tid] = advance(s, data)
            else:
                self.next_state[ACCEPT][tid] = advance(ACCEPT, data)
        self._allowed: list[bytearray] = []
        for s in range(NUM_STATES):
            row = self.next_state[s]
            self._allowed.append(bytearray(0 if v == ERR else 1 for v in row))

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike[str], vocab_size: int | None = None):
        return cls(load_tokenizer_json(path), vocab_size)

    def step(self, state: int, token_id: int) -> int:
        if state == ERR or not 0 <= token_id < self.vocab_size:
            return ERR
        return self.next_state[state][token_id]

    def allowed(self, state: int) -> bytearray:
        """1 for every token allowed from ``state`` (length vocab_size)."""
        return self._allowed[state]

    def allowed_ids(self, state: int) -> list[int]:
        return [i for i, ok in enumerate(self._allowed[state]) if ok]

    def banned_ids(self, state: int) -> list[int]:
        return [i for i, ok in enumerate(self._allowed[state]) if not ok]

    def counts(self) -> dict[str, int]:
        out = {COMPLETE: 0, FRAGMENT: 0, CONTINUATION: 0, INVALID: 0}
        for c in self.classes.values():
            out[c] += 1
        return out


class RequestState:
    """Automaton state of one request, fed incrementally from its (growing) output id list.

    Negative ids (placeholders some schedulers put in before the real token is known) stop the
    catch-up; they are re-read on the next call. If an id ever drives the state to ERR (the guard
    was off for it, or a token came from outside), the state resets to ACCEPT: masking must go on.
    """

    __slots__ = ("table", "output", "consumed", "state", "enabled")

    def __init__(self, table: GuardTable, output: Sequence[int], enabled: bool = True):
        self.table = table
        self.output = output
        self.consumed = 0
        self.state = ACCEPT
        self.enabled = enabled

    def catch_up(self) -> int:
        out = self.output
        n = len(out)
        while self.consumed < n:
            tid = out[self.consumed]
            if tid < 0:
                break
            nxt = self.table.step(self.state, tid)
            self.state = ACCEPT if nxt == ERR else nxt
            self.consumed += 1
        return self.state


def request_enabled(params: Any) -> bool:
    """False when the request opted out with extra_args={"utf8_guard": false}."""
    extra = getattr(params, "extra_args", None)
    if isinstance(extra, Mapping) and "utf8_guard" in extra:
        return bool(extra["utf8_guard"])
    return True


def split_added(entry: Sequence[Any]) -> tuple[int, Any, Sequence[int]]:
    """(index, params, output ids) from a BatchUpdate ``added`` tuple of any vLLM v1 layout:
    (index, params, output), (index, params, prompt, output) or (prompt, index, params, output)."""
    if len(entry) == 3:
        return int(entry[0]), entry[1], entry[2]
    if isinstance(entry[0], int):
        return int(entry[0]), entry[1], entry[3]
    return int(entry[1]), entry[2], entry[3]


class BatchStates:
    """Request states keyed by persistent-batch index, following vLLM's BatchUpdate rules:
    removed, then added, then moved (unidirectional or swap), in order."""

    def __init__(self, table: GuardTable):
        self.table = table
        self.by_index: dict[int, RequestState] = {}

    def update(
        self,
        removed: Iterable[int],
        added: Iterable[Sequence[Any]],
        moved: Iterable[tuple[int, int, Any]],
    ) -> None:
        for idx in removed:
            self.by_index.pop(idx, None)
        for entry in added:
            idx, params, output = split_added(entry)
            self.by_index[idx] = RequestState(self.table, output, request_enabled(params))
        for src, dst, direction in moved:
            swap = getattr(direction, "name", str(direction)).upper().endswith("SWAP")
            a = self.by_index.pop(src, None)
            b = self.by_index.pop(dst, None)
            if a is not None:
                self.by_index[dst] = a
            if swap and b is not None:
                self.by_index[src] = b

    def catch_up(self) -> None:
        for st in self.by_index.values():
            st.catch_up()

    def row_states(self, batch_size: int) -> list[int | None]:
        """State per row for the next apply; None = leave the row alone."""
        out: list[int | None] = []
        for i in range(batch_size):
            st = self.by_index.get(i)
            out.append(st.state if st is not None and st.enabled else None)
        return out


def mask_row(row: list[float], allowed: bytearray, fill: float = float("-inf")) -> list[float]:
    """Pure-Python masking of one logits row (reference for the torch path and for tests).
    Never masks a row entirely: with no allowed token the row is returned unchanged."""
    n = min(len(row), len(allowed))
    if not any(allowed[:n]):
        return row
    return [v if i < n and allowed[i] else fill for i, v in enumerate(row)]


# --- vLLM adapter (torch and vllm imported lazily) ----------------------------------------------
def _tokenizer_source(vllm_config: Any) -> str:
    env = os.environ.get("SPARKRIG_UTF8_GUARD_TOKENIZER")
    if env:
        return env
    model_config = getattr(vllm_config, "model_config", None)
    src = getattr(model_config, "tokenizer", None) or getattr(model_config, "model", None)
    if not src:
        raise RuntimeError(
            "utf8_guard: cannot find the tokenizer; set SPARKRIG_UTF8_GUARD_TOKENIZER to the "
            "model directory or its tokenizer.json"
        )
    return str(src)


def _vocab_size(vllm_config: Any) -> int | None:
    model_config = getattr(vllm_config, "model_config", None)
    getter = getattr(model_config, "get_vocab_size", None)
    try:
        return int(getter()) if callable(getter) else None
    except Exception:  # noqa: BLE001 - only a size hint
        return None


def _speculative_tokens(vllm_config: Any) -> int:
    spec = getattr(vllm_config, "speculative_config", None)
    return int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0


def _interface_bases() -> tuple[type, ...]:
    """vLLM's logits-processor base classes present in this install, V2 first.

    Model Runner V2 (the default from vLLM 0.33 on) loads only subclasses of
    ``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``; the V1 runner only subclasses
    of ``vllm.v1.sample.logits_processor.LogitsProcessor``. The guard subclasses both, so the one
    ``--logits-processors utf8_guard_lp:Utf8GuardLogitsProcessor`` loads on whichever runner the
    image's vLLM picks (an older build may lack the V2 module: then it is a V1 processor only).
    """
    bases: list[type] = []
    try:
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2Base

        bases.append(V2Base)
    except ImportError:
        pass
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor as V1Base

        bases.append(V1Base)
    except ImportError:
        pass
    return tuple(bases) or (object,)  # tests of the pure adapter run with torch but no vLLM


def _build_processor_class() -> type:
    import torch

    class Utf8GuardLogitsProcessor(*_interface_bases()):  # type: ignore[misc]
        """vLLM logits processor for both model runners; see the module docstring.

        V2: ``__init__(vllm_config, req_states)``, ``add_request(req_idx, params)``,
        ``apply(logits, ctx)``; each request's output is read from ``req_states.all_token_ids``
        between ``prompt_len`` and ``total_len`` of its slot. V1: ``__init__(vllm_config, device,
        is_pin_memory)``, ``update_state(batch_update)``, ``apply(logits)``; the output list comes
        with the BatchUpdate. The number of constructor arguments tells the runners apart.
        """

        def __init__(self, vllm_config: Any, *args: Any) -> None:
            if _speculative_tokens(vllm_config):
                # V1 refuses custom processors with speculation by itself; V2 would call apply()
                # with one row per draft token, whose states depend on unverified drafts.
                raise ValueError(
                    "utf8_guard: the UTF-8 guard does not support speculative decoding; serve "
                    "without --speculative-config (the guard profile does)"
                )
            table = GuardTable.from_tokenizer_json(
                _tokenizer_source(vllm_config), _vocab_size(vllm_config)
            )
            if len(args) == 1:  # V2: (vllm_config, req_states)
                req_states = args[0]
                self._init_from_table(table, req_states.device)
                self._init_v2(req_states)
            elif len(args) == 2:  # V1: (vllm_config, device, is_pin_memory)
                self._init_from_table(table, args[0])
            else:
                raise TypeError(
                    "Utf8GuardLogitsProcessor(vllm_config, req_states) [V2] or "
                    "(vllm_config, device, is_pin_memory) [V1]"
                )

        def _init_from_table(self, table: GuardTable, device: Any) -> None:
            self.table = table
            self.device = torch.device(device) if device is not None else torch.device("cpu")
            self.batch = BatchStates(table)
            self.batch_size = 0
            self.req_states: Any = None
            # banned[s] is True where token is masked in state s; one extra all-False row (index
            # NUM_STATES) for rows the guard leaves alone
            rows = []
            for s in range(NUM_STATES):
                allowed = torch.frombuffer(bytearray(table.allowed(s)), dtype=torch.uint8)
                banned = allowed == 0
                if bool(banned.all()):  # never mask a whole row
                    banned = torch.zeros_like(banned)
                rows.append(banned)
            rows.append(torch.zeros(table.vocab_size, dtype=torch.bool))
            self._banned = torch.stack(rows).to(self.device)

        @classmethod
        def from_table(cls, table: GuardTable, device: Any = "cpu") -> Utf8GuardLogitsProcessor:
            obj = cls.__new__(cls)
            obj._init_from_table(table, device)
            return obj

        # --- shared -----------------------------------------------------------------------
        def _mask(self, logits: Any, states: Any) -> Any:
            """Mask each row by its automaton state (a long tensor; NUM_STATES = leave alone)."""
            n_rows, width = int(logits.shape[0]), int(logits.shape[1])
            banned = self._banned.index_select(0, states.to(self._banned.device))
            vocab = banned.shape[1]
            if width > vocab:  # ids past the tokenizer: ban where the row is guarded
                pad = (states != NUM_STATES).to(banned.device).unsqueeze(1)
                banned = torch.cat([banned, pad.expand(n_rows, width - vocab)], dim=1)
            elif width < vocab:
                banned = banned[:, :width]
            logits.masked_fill_(banned.to(logits.device), float("-inf"))
            return logits

        def apply(self, logits: Any, ctx: Any = None) -> Any:
            if ctx is not None:
                return self._apply_v2(logits, ctx)
            states = self.batch.row_states(int(logits.shape[0]))
            if all(s is None for s in states):
                return logits
            idx = torch.tensor([NUM_STATES if s is None else s for s in states], dtype=torch.long)
            return self._mask(logits, idx)

        # --- V1 runner --------------------------------------------------------------------
        def is_argmax_invariant(self) -> bool:
            return False  # it changes which token wins

        def update_state(self, batch_update: Any) -> None:
            if batch_update is not None:
                self.batch.update(batch_update.removed, batch_update.added, batch_update.moved)
                self.batch_size = int(batch_update.batch_size)
            self.batch.catch_up()

        # --- V2 runner --------------------------------------------------------------------
        def _init_v2(self, req_states: Any) -> None:
            self.req_states = req_states
            n = int(req_states.max_num_reqs)
            self._slot_enabled = [False] * n
            self._slot_consumed: list[int | None] = [None] * n
            self._slot_state = [ACCEPT] * n

        def add_request(self, req_idx: int, sampling_params: Any) -> bool:
            """A request enters slot ``req_idx``: forget the slot's previous occupant."""
            enabled = request_enabled(sampling_params)
            self._slot_enabled[req_idx] = enabled
            self._slot_consumed[req_idx] = None  # start at prompt_len on the first apply
            self._slot_state[req_idx] = ACCEPT
            return enabled

        def _catch_up_slot(self, slot: int, total: int) -> int:
            consumed = self._slot_consumed[slot]
            if consumed is None:
                consumed = int(self.req_states.prompt_len.np[slot])
            state = self._slot_state[slot]
            if total > consumed:
                new = self.req_states.all_token_ids.gpu[slot, consumed:total].tolist()
                for tid in new:
                    nxt = self.table.step(state, int(tid))
                    state = ACCEPT if nxt == ERR else nxt
                consumed = total
            self._slot_consumed[slot] = consumed
            self._slot_state[slot] = state
            return state

        def _apply_v2(self, logits: Any, ctx: Any) -> Any:
            slots = [int(s) for s in ctx.idx_mapping_np]
            guarded = [s for s in slots if self._slot_enabled[s]]
            if not guarded:
                return logits
            totals = self.req_states.total_len.gpu[guarded].tolist()  # one device read per step
            per_slot = torch.full((len(self._slot_enabled),), NUM_STATES, dtype=torch.long)
            for slot, total in zip(guarded, totals, strict=True):
                per_slot[slot] = self._catch_up_slot(slot, int(total))
            rows = ctx.expanded_idx_mapping.to(device="cpu", dtype=torch.long)
            return self._mask(logits, per_slot.index_select(0, rows))

    Utf8GuardLogitsProcessor.__module__ = __name__
    return Utf8GuardLogitsProcessor


_CLASS_CACHE: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name == "Utf8GuardLogitsProcessor":
        if name not in _CLASS_CACHE:
            _CLASS_CACHE[name] = _build_processor_class()
        return _CLASS_CACHE[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 utf8_guard_lp.py MODEL_DIR``: print the token class counts (a sanity check)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: utf8_guard_lp.py MODEL_DIR|tokenizer.json", file=sys.stderr)
        return 2
    table = GuardTable.from_tokenizer_json(args[0])
    print(json.dumps({"vocab_size": table.vocab_size, **table.counts()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

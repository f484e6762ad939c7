"""UTF-8 guard: masking on a synthetic byte-level BPE vocabulary (pure, then the torch adapter)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from serving_helpers import REPO, files_module

g = files_module("utf8_guard_lp")

B2U = g.bytes_to_unicode()


def enc(data: bytes) -> str:
    """Spell bytes the way a byte-level BPE tokenizer.json does."""
    return "".join(B2U[b] for b in data)


# Named merged tokens on top of the 256 single-byte base tokens (ids 0..255 = byte value).
KANJI_FRAGMENTS = {
    "測": (b"\xe6\xb8", b"\xac"),
    "範": (b"\xe7\xaf", b"\x84"),
    "陥": (b"\xe9\x99", b"\xa5"),
}
MERGED: list[bytes] = [
    b"hello",
    b" world",
    "現場".encode(),  # whole characters: complete
    "定".encode(),
    b"\xe6\xb8",  # 測 fragment
    b"\xe7\xaf",  # 範 fragment
    b"\xe9\x99",  # 陥 fragment
    b"\xac\xe5\xae",  # continuation + next fragment (ac + 定's first two bytes)
    b"\x84 ok",  # continuation then ASCII
    b"\xc0\x80",  # overlong NUL: invalid
    b"\xe6A",  # lead then ASCII: invalid
    b"\xed\xa0\x80",  # surrogate: invalid
    b"\xf5\x80",  # beyond U+10FFFF: invalid
    b"\xe0\x80",  # overlong 3-byte start: invalid
]
SPECIAL = ["<|endoftext|>", "<tool_call>"]


def make_tokenizer_json() -> dict[str, Any]:
    vocab: dict[str, int] = {enc(bytes([b])): b for b in range(256)}
    for data in MERGED:
        vocab[enc(data)] = len(vocab)
    added = [{"id": len(vocab) + i, "content": s, "special": True} for i, s in enumerate(SPECIAL)]
    added.append({"id": len(vocab) + len(SPECIAL), "content": "<plain>", "special": False})
    return {"model": {"type": "BPE", "vocab": vocab, "merges": []}, "added_tokens": added}


TOK = make_tokenizer_json()
VOCAB: dict[str, int] = TOK["model"]["vocab"]


def tid(data: bytes) -> int:
    return VOCAB[enc(data)]


EOS = TOK["added_tokens"][0]["id"]
PLAIN = TOK["added_tokens"][2]["id"]


@pytest.fixture(scope="module")
def table() -> Any:
    return g.GuardTable(g.token_bytes_from_tokenizer_json(TOK), vocab_size=PLAIN + 1 + 3)


def test_bytes_to_unicode_is_gpt2_mapping() -> None:
    assert len(B2U) == 256 and len(set(B2U.values())) == 256
    assert B2U[ord("A")] == "A" and B2U[ord(" ")] == "Ġ" and B2U[ord("\n")] == "Ċ"
    assert g.decode_token_string("Ġworld") == b" world"


def test_token_bytes_from_tokenizer_json() -> None:
    tb = g.token_bytes_from_tokenizer_json(TOK)
    assert tb[tid(b"\xe6\xb8")] == b"\xe6\xb8"
    assert tb[EOS] is None
    assert tb[PLAIN] == b"<plain>"


@pytest.mark.parametrize(
    ("data", "cls"),
    [
        (b"hello", "complete"),
        ("現場".encode(), "complete"),
        (None, "complete"),
        (b"\xe6\xb8", "fragment"),
        (b"\xe6", "fragment"),
        (b"\xac", "continuation"),
        (b"\xac\xe5\xae", "continuation"),
        (b"\x84 ok", "continuation"),
        (b"\xc0\x80", "invalid"),
        (b"\xe6A", "invalid"),
        (b"\xed\xa0\x80", "invalid"),
        (b"\xf5\x80", "invalid"),
        (b"\xff", "invalid"),
        (b"\xe0\x80", "invalid"),
    ],
)
def test_token_class(data: bytes | None, cls: str) -> None:
    assert g.token_class(data) == cls


def test_kanji_split_spellings_decode() -> None:
    for ch, (frag, cont) in KANJI_FRAGMENTS.items():
        assert (frag + cont).decode("utf-8") == ch
        assert g.advance(g.ACCEPT, frag) == g.NEED1
        assert g.advance(g.NEED1, cont) == g.ACCEPT


def test_boundary_bans_continuations_and_invalid(table: Any) -> None:
    allowed = table.allowed(g.ACCEPT)
    assert allowed[ord("a")] and allowed[tid(b"hello")] and allowed[tid(b"\xe6\xb8")]
    assert allowed[EOS] and allowed[PLAIN]
    for b in range(0x80, 0xC0):
        assert not allowed[b], hex(b)  # lone continuation bytes
    assert not allowed[tid(b"\xac\xe5\xae")] and not allowed[tid(b"\x84 ok")]
    for bad in (b"\xc0\x80", b"\xe6A", b"\xed\xa0\x80", b"\xf5\x80", b"\xe0\x80"):
        assert not allowed[tid(bad)]
    for b in (0xC0, 0xC1, 0xF5, 0xFF):
        assert not allowed[b]


def test_after_fragment_only_missing_continuation(table: Any) -> None:
    state = table.step(g.ACCEPT, tid(b"\xe6\xb8"))  # 測 minus its last byte
    assert state == g.NEED1
    ok = set(table.allowed_ids(state))
    assert tid(b"\xac") in ok  # completes 測
    assert tid(b"\xac\xe5\xae") in ok and tid(b"\x84 ok") in ok
    assert ok == set(range(0x80, 0xC0)) | {tid(b"\xac\xe5\xae"), tid(b"\x84 ok")}
    assert EOS not in ok and ord("a") not in ok and tid(b"hello") not in ok


def test_second_byte_ranges_are_exact(table: Any) -> None:
    assert table.step(g.ACCEPT, 0xE0) == g.E0_2ND
    assert set(table.allowed_ids(g.E0_2ND)) == set(range(0xA0, 0xC0))
    assert set(table.allowed_ids(g.ED_2ND)) >= set(range(0x80, 0xA0))
    assert not set(table.allowed_ids(g.ED_2ND)) & set(range(0xA0, 0xC0))
    assert set(table.allowed_ids(g.F4_2ND)) == set(range(0x80, 0x90))


def test_padding_ids_always_banned(table: Any) -> None:
    for s in range(g.NUM_STATES):
        assert not any(table.allowed(s)[PLAIN + 1 :])


def test_counts(table: Any) -> None:
    c = table.counts()
    assert c["invalid"] >= 5 + 13  # 5 merged + C0, C1, F5..FF
    assert c["continuation"] == 64 + 2


def test_request_state_follows_live_list(table: Any) -> None:
    out: list[int] = []
    st = g.RequestState(table, out)
    assert st.catch_up() == g.ACCEPT
    out.append(tid(b"\xe6\xb8"))
    assert st.catch_up() == g.NEED1
    out.append(-1)  # placeholder: not consumed yet
    assert st.catch_up() == g.NEED1 and st.consumed == 1
    out[-1] = tid(b"\xac\xe5\xae")
    assert st.catch_up() == g.NEED1  # 測 done, 定 started
    out.append(tid(b"\x84 ok"))  # not 定's continuation (ae9a): ERR -> reset
    assert st.catch_up() == g.ACCEPT


def test_batch_states_add_remove_move_swap(table: Any) -> None:
    bs = g.BatchStates(table)
    a: list[int] = [tid(b"\xe6\xb8")]
    b: list[int] = []
    c: list[int] = [0xE0]
    params = SimpleNamespace(extra_args=None)
    off = SimpleNamespace(extra_args={"utf8_guard": False})
    bs.update([], [(0, params, [], a), (1, params, [], b), (2, off, [], c)], [])
    bs.catch_up()
    assert bs.row_states(3) == [g.NEED1, g.ACCEPT, None]
    swap = SimpleNamespace(name="SWAP")
    bs.update([], [], [(0, 1, swap)])
    assert bs.row_states(3) == [g.ACCEPT, g.NEED1, None]
    uni = SimpleNamespace(name="UNIDIRECTIONAL")
    bs.update([0], [], [(2, 0, uni)])
    assert bs.row_states(3) == [None, g.NEED1, None]
    assert set(bs.by_index) == {0, 1}
    # older 3-tuple layout and the (prompt, index, params, output) layout
    bs.update([], [(2, params, [0xE6])], [])
    bs.update([], [([1, 2], 3, params, [ord("x")])], [])
    bs.catch_up()
    assert bs.row_states(4)[2:] == [g.NEED2, g.ACCEPT]


def test_mask_row_never_empties(table: Any) -> None:
    row = [0.0] * table.vocab_size
    masked = g.mask_row(row, table.allowed(g.NEED1))
    assert masked[0xAC] == 0.0 and masked[ord("a")] == float("-inf")
    assert g.mask_row([1.0, 2.0], bytearray(2)) == [1.0, 2.0]


def _walk(table: Any, steps: int, seed: int, guard: bool) -> bytes:
    tb = g.token_bytes_from_tokenizer_json(TOK)
    rng = random.Random(seed)
    out: list[int] = []
    st = g.RequestState(table, out)
    ids = [i for i in range(table.vocab_size) if i in tb]
    i = 0
    while i < steps or (guard and st.catch_up() != g.ACCEPT):
        pool = table.allowed_ids(st.catch_up()) if guard else ids
        out.append(rng.choice(pool))
        i += 1
    st.catch_up()
    return b"".join(tb[t] or b"" for t in out)


@pytest.mark.parametrize("seed", range(20))
def test_random_walk_of_allowed_tokens_is_valid_utf8(table: Any, seed: int) -> None:
    text = _walk(table, 400, seed, guard=True).decode("utf-8")  # strict: raises on bad bytes
    assert "\ufffd" not in text


def test_random_walk_without_guard_breaks(table: Any) -> None:
    bad = 0
    for seed in range(20):
        try:
            _walk(table, 400, seed, guard=False).decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    assert bad > 15


def test_load_tokenizer_json_from_dir_and_cli(tmp_path: Any) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps(TOK), encoding="utf-8")
    table = g.GuardTable.from_tokenizer_json(tmp_path)
    assert table.step(g.ACCEPT, tid(b"\xe6\xb8")) == g.NEED1
    with pytest.raises(FileNotFoundError):
        g.load_tokenizer_json(tmp_path / "missing")
    res = subprocess.run(
        [sys.executable, str(REPO / "files" / "utf8_guard_lp.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(res.stdout)["fragment"] >= 3


def test_module_import_does_not_import_torch() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'files')!r}); import utf8_guard_lp; "
        "assert 'torch' not in sys.modules and 'vllm' not in sys.modules; print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError):
        _ = g.NoSuchThing


# The torch adapter is tested through vLLM's own V1 and V2 loaders, with vLLM's real classes, in
# test_utf8_guard_vllm.py.

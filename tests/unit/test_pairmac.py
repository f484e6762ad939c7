"""Signed helper calls (files/sparkhost/pairmac.py): what a receiver accepts and refuses, with
the clock injected; and the secret a helper refuses to start with."""

from __future__ import annotations

import pytest
from sparkhost import pairmac

SECRET = "0123456789abcdef" * 3
KEY = pairmac.derive(SECRET)
AGENT = "192.168.100.11:29601"
NOW = 1_800_000_000.0


def signed(now: float = NOW, key: bytes = KEY, method: str = "POST", path: str = "/stop",
           receiver: str = AGENT, body: bytes = b"") -> dict[str, str]:  # fmt: skip
    return pairmac.sign(key, method, path, receiver, body, now=now)


def check(v: pairmac.Verifier, headers: dict[str, str], now: float = NOW, method: str = "POST",
          path: str = "/stop", receiver: str = AGENT, body: bytes = b"") -> int:  # fmt: skip
    return v.check(headers, method, path, receiver, body, now=now)[0]


def test_a_signed_request_is_accepted_once_and_its_replay_refused():
    v = pairmac.Verifier(KEY)
    captured = signed()
    assert check(v, captured) == 0
    assert v.check(captured, "POST", "/stop", AGENT, now=NOW + 5) == (
        409,
        "replayed: this request was already answered",
    )
    assert check(v, signed()) == 0  # a fresh nonce is a new request


def test_a_replay_after_its_nonce_left_the_cache_is_refused_by_the_window():
    v = pairmac.Verifier(KEY, window=30)
    captured = signed()
    assert check(v, captured) == 0
    check(v, signed(now=NOW + 40), now=NOW + 40)  # purges the first nonce
    assert captured[pairmac.NONCE] not in v.seen
    assert check(v, captured, now=NOW + 40) == 401


@pytest.mark.parametrize("skew", [-31, 31, -3600, 10**9])
def test_a_time_outside_the_window_is_refused(skew):
    v = pairmac.Verifier(KEY, window=30)
    status, why = v.check(signed(now=NOW + skew), "POST", "/stop", AGENT, now=NOW)
    assert status == 401
    # signed with the secret: the sender may learn by how much (the ranks' clocks), no one else
    assert why.startswith(f"stale: signed {skew:+d} s from this rank's clock (window 30 s)")
    assert v.seen == {}  # nothing remembered of a refused request
    wrong = pairmac.sign(pairmac.derive("f" * 48), "POST", "/stop", AGENT, now=NOW + skew)
    assert v.check(wrong, "POST", "/stop", AGENT, now=NOW) == (401, "unsigned")


@pytest.mark.parametrize("skew", [-30, 0, 30])
def test_a_clock_a_little_off_is_accepted(skew):
    assert check(pairmac.Verifier(KEY, window=30), signed(now=NOW + skew)) == 0


@pytest.mark.parametrize(
    ("what", "headers", "kwargs"),
    [
        ("another secret", signed(key=pairmac.derive("f" * 48)), {}),
        ("another receiver", signed(receiver="192.168.100.12:29601"), {}),
        ("another path", signed(path="/start"), {}),
        ("another method", signed(method="GET"), {}),
        ("another body", signed(body=b"x"), {}),
        ("a body added", signed(), {"body": b"x"}),
    ],
)
def test_a_wrong_mac_is_refused(what, headers, kwargs):
    v = pairmac.Verifier(KEY)
    assert check(v, headers, **kwargs) == 401, what
    assert v.seen == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (pairmac.MAC, ""),
        (pairmac.MAC, "A" * 64),  # upper case is not what sign() makes
        (pairmac.MAC, "é" * 64),  # compare_digest raises on non-ASCII str (facts 4c)
        (pairmac.NONCE, "0" * 31),
        (pairmac.TIME, "-5"),
        (pairmac.TIME, "soon"),  # int() would raise
        (pairmac.TIME, "１８"),  # Unicode digits: int() takes them, the signer never sends them
        (pairmac.TIME, "1" * 13),
    ],
)
def test_a_malformed_header_is_refused_before_the_mac(field, value):
    headers = {**signed(), field: value}
    assert check(pairmac.Verifier(KEY), headers) == 401


def test_the_static_bearer_of_old_is_refused():
    v = pairmac.Verifier(KEY)
    assert check(v, {"X-Sparkrig-Token": SECRET}) == 401


def test_a_full_nonce_cache_refuses_rather_than_forgets_a_live_nonce():
    v = pairmac.Verifier(KEY, window=30, cap=2)
    first = signed()
    assert check(v, first) == 0
    assert check(v, signed()) == 0
    assert check(v, signed()) == 503  # full: refused, the first nonce kept
    assert check(v, first) == 409  # still a replay
    assert check(v, signed(now=NOW + 40), now=NOW + 40) == 0  # the window moved on


def test_sign_makes_a_fresh_nonce_each_time():
    assert signed()[pairmac.NONCE] != signed()[pairmac.NONCE]


@pytest.mark.parametrize(
    ("text", "said"),
    [("", "is empty (0 characters"), ("\n  \n", "is empty"), ("s3cret\n", "too short (6")],
)
def test_an_empty_or_short_secret_cannot_sign(tmp_path, text, said):
    f = tmp_path / "pair-token"
    f.write_text(text)
    with pytest.raises(pairmac.SecretError) as err:
        pairmac.load_secret(str(f))
    assert said in str(err.value)
    assert str(f) in str(err.value)
    assert "pyinfra inventory.py deploy.py" in str(err.value)  # the next step
    assert "s3cret" not in str(err.value)


def test_a_missing_secret_file_cannot_sign(tmp_path):
    with pytest.raises(pairmac.SecretError, match="cannot be read"):
        pairmac.load_secret(str(tmp_path / "none"))


def test_a_secret_of_the_minimum_length_signs(tmp_path):
    f = tmp_path / "pair-token"
    f.write_text(" " + "a" * pairmac.MIN_SECRET + "\n")
    assert pairmac.load_secret(str(f)) == pairmac.derive("a" * pairmac.MIN_SECRET)
    assert pairmac.derive("a" * pairmac.MIN_SECRET) != ("a" * pairmac.MIN_SECRET).encode()

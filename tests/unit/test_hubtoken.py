"""sparkrig/hubtoken.py: the Hub token is the one huggingface_hub finds; a gated repo without one
is refused, naming it and how to log in."""

from __future__ import annotations

import huggingface_hub.constants
import pytest

from sparkrig.hubtoken import hub_token, in_clear, missing_for

REPO = "org/gated-model"


@pytest.fixture
def login_file(monkeypatch, tmp_path):
    """No token in the environment; returns where `hf auth login` keeps it (not written yet)."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "token"
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(path))
    return path


def test_hf_token_wins_over_the_login_file_which_is_read_without_it(monkeypatch, login_file):
    login_file.write_text("  hf_fromTheFile\n")
    assert hub_token() == "hf_fromTheFile"
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_older")
    assert hub_token() == "hf_older"
    monkeypatch.setenv("HF_TOKEN", "hf_fromTheEnvironment")
    assert hub_token() == "hf_fromTheEnvironment"


def test_no_token_anywhere_is_none(login_file):
    assert hub_token() is None
    login_file.write_text("\n")  # an empty login file is no token
    assert hub_token() is None


@pytest.mark.parametrize("gated", ["manual", "auto"])
def test_a_gated_repo_without_a_token_is_refused_naming_it_and_how_to_log_in(login_file, gated):
    why = missing_for(REPO, gated, "https://huggingface.co/")
    assert why is not None
    assert why.startswith(f"{REPO} is gated on the Hub ({gated} approval)")
    assert "hf auth login" in why and "HF_TOKEN" in why
    assert "https://huggingface.co/org/gated-model" in why


def test_a_token_or_an_open_repo_is_not_refused(monkeypatch, login_file):
    assert missing_for(REPO, False, "https://huggingface.co") is None
    assert missing_for(REPO, None, "https://huggingface.co") is None  # a lockfile from before
    login_file.write_text("hf_x\n")
    assert missing_for(REPO, "manual", "https://huggingface.co") is None


def test_the_token_never_goes_to_a_plain_http_endpoint_off_loopback(monkeypatch, login_file):
    login_file.write_text("hf_x\n")
    why = in_clear(REPO, "manual", "http://mirror.example.lan:8080")
    assert why is not None and "in clear" in why and "https://" in why
    assert in_clear(REPO, "manual", "https://mirror.example.lan") is None
    assert in_clear(REPO, "manual", "http://127.0.0.1:8080") is None  # never leaves the machine
    assert in_clear(REPO, False, "http://mirror.example.lan") is None  # an open repo: no token
    login_file.unlink()
    assert in_clear(REPO, "manual", "http://mirror.example.lan") is None  # no token to send

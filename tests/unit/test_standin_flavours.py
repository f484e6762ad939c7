"""The stand-in's engine flavours (lab/standin_flavour.py): each answers a stack's argv and env as
its real engine does: stock vLLM 0.33 refuses Entrpi's fork-only values when it builds its engine
config, the fork takes them, the never-ready engine boots and never serves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkrig.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "standin_vllm.py"
flavours = load_script("standin_flavour", REPO / "lab" / "standin_flavour.py")
standin = load_script("standin_vllm", STANDIN)

# Entrpi v2.3's launcher defaults for rank 0 (docs/stacks-facts.md E.4), the optional fork-only
# mixed-prefill flag added; the model path is the test's
ENTRPI_ARGV = [
    "--served-model-name", "glm-5.3-flash", "--host", "127.0.0.1", "--trust-remote-code",
    "--quantization", "exl3", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.85",
    "--max-model-len", "524288", "--max-num-seqs", "4", "--block-size", "2304",
    "--mm-processor-cache-gb", "0.5", "--load-format", "instanttensor",
    "--max-num-batched-tokens", "8192", "--kv-cache-dtype", "fp8_ds_mla",
    "--attention-backend", "B12X_MLA_SPARSE", "--kv-cache-dtype-skip-layers", "sliding_window",
    "--kv-cache-memory", "14400000000", "--prefix-match-unit", "512", "--skip-mm-profiling",
    "--tool-call-parser", "glm47", "--enable-auto-tool-choice", "--reasoning-parser", "glm45",
    "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--mixed-prefill-token-cap", "4096",
]  # fmt: skip
# sfxnz v13's head flags that are not sparkrig's today (docs/stacks-facts.md S.4)
SFXNZ_ARGV = [
    "--kv-cache-dtype", "fp8_e4m3", "--kv-cache-memory", "4445787956", "--block-size", "2304",
    "--moe-backend", "marlin", "--linear-backend", "marlin", "--max-num-seqs", "2",
    "--compilation-config", '{"cudagraph_capture_sizes":[1,2,4,8,16]}',
    "--limit-mm-per-prompt", '{"image":4,"video":1}',
    "--override-generation-config", '{"max_new_tokens": 65536}',
]  # fmt: skip
FORK_ENV = {"VLLM_USE_B12X_FP8_GEMM": "1", "VLLM_DFLASH_FP8_DRAFT_HEAD": "1"}


def opts(flavour: str, argv: list[str]) -> Any:
    """The stand-in's parse of ``serve /m ARGV`` with the flavour's flag list."""
    return standin.parse_args(["serve", "/m", *argv], standin.load_flags(flavours.load(flavour)))


def refusal(flavour: str, argv: list[str]) -> str | None:
    """What the flavour's engine says when it builds its config from ARGV (None: it builds)."""
    error: str | None = flavours.config_error(flavours.load(flavour), opts(flavour, argv).get)
    return error


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def run_standin(flavour: str, model: Path, argv: list[str], env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    environ.update({flavours.ENV: flavour, "STANDIN_DELAY": "0", **(env or {})})
    return subprocess.run(
        [sys.executable, str(STANDIN), "serve", str(model), "--host", "127.0.0.1", *argv],
        capture_output=True, text=True, env=environ, timeout=60,
    )  # fmt: skip


# --- the flag lists ----------------------------------------------------------------------------


def test_the_stock_flavour_is_the_extracted_vllm_033() -> None:
    stock = flavours.load("vllm-0.33")
    lines = (REPO / "lab" / "vllm-flags.txt").read_text().splitlines()
    assert stock.flags == dict(ln.split() for ln in lines if not ln.startswith("#"))
    assert "modelopt_fp4" in stock.values["quantization"]
    assert "exl3" not in stock.values["quantization"]
    assert "B12X" in stock.values["attention-backend"]
    assert "VLLM_HOST_IP" in stock.env and "VLLM_USE_B12X_FP8_GEMM" not in stock.env


def test_the_image_picks_the_flavour_and_stock_is_the_default() -> None:
    assert flavours.load(environ={}).name == "vllm-0.33"  # an older lab's image
    assert flavours.load(environ={flavours.ENV: "entrpi-fork"}).name == "entrpi-fork"
    with pytest.raises(SystemExit, match="'vllm-0.34' is not a flavour: one of vllm-0.33, "):
        flavours.load(environ={flavours.ENV: "vllm-0.34"})


def test_entrpi_fork_takes_what_stock_vllm_refuses() -> None:
    assert opts("entrpi-fork", ENTRPI_ARGV).unknown == []
    assert refusal("entrpi-fork", ENTRPI_ARGV) is None
    # stock 0.33: the fork's own flag fails argparse ...
    assert opts("vllm-0.33", ENTRPI_ARGV).unknown == ["--mixed-prefill-token-cap", "4096"]
    # ... the fork's values pass it and fail when the engine config is built, quantization first
    stock_argv = ENTRPI_ARGV[:-2]
    assert opts("vllm-0.33", stock_argv).unknown == []
    error = refusal("vllm-0.33", stock_argv)
    assert error is not None and error.startswith(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, Unknown quantization method: exl3. Must be one of ['awq', 'auto_awq', "
    )


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--attention-backend", "B12X_MLA_SPARSE"],
         "ValueError: Unknown attention backend: 'B12X_MLA_SPARSE'. Valid options are: FLASH_"),
        (["--attention-backend", "b12x_mla_sparse"],
         "ValueError: Unknown attention backend: 'B12X_MLA_SPARSE'. "),
        (["-q", "exl3"], "pydantic_core._pydantic_core.ValidationError: "),
        (["--attention-backend", "b12x"], None),  # looked up upper-cased, as vLLM does
        (["--attention-backend", "auto"], None),
        (["--quantization", "modelopt_fp4"], None),
    ],
)  # fmt: skip
def test_stock_refuses_at_the_config_stage_as_vllm_033(argv: list[str], error: str | None) -> None:
    got = refusal("vllm-0.33", argv)
    assert got == error if error is None else (got or "").startswith(error)


def test_sfxnz_v13_is_stock_033_and_takes_its_argv() -> None:
    """Its vLLM version is unknown (lab/flavours/sfxnz-v13.txt says why): 0.33, nothing added."""
    sfxnz, stock = flavours.load("sfxnz-v13"), flavours.load("vllm-0.33")
    assert (sfxnz.flags, sfxnz.values, sfxnz.env) == (stock.flags, stock.values, stock.env)
    assert opts("sfxnz-v13", SFXNZ_ARGV).unknown == []
    assert refusal("sfxnz-v13", SFXNZ_ARGV) is None


def test_the_environment_check_knows_each_flavours_variables() -> None:
    env = {"VLLM_HOST_IP": "10.0.0.1", "HF_HOME": "/cache", **FORK_ENV}
    assert flavours.unknown_env(flavours.load("vllm-0.33"), env) == list(FORK_ENV)
    assert flavours.unknown_env(flavours.load("entrpi-fork"), env) == []


def test_never_ready_takes_every_flavours_argv() -> None:
    never = flavours.load("never-ready")
    assert never.never_ready and not flavours.load("entrpi-fork").never_ready
    for argv in (ENTRPI_ARGV, SFXNZ_ARGV):
        assert opts("never-ready", argv).unknown == []
        assert refusal("never-ready", argv) is None
    assert flavours.unknown_env(never, FORK_ENV) == []


# --- the stand-in process -----------------------------------------------------------------------


def test_stock_process_refuses_exl3_after_argparse_with_vllms_exception(model_dir: Path) -> None:
    r = run_standin("vllm-0.33", model_dir, ["--quantization", "exl3", "--port", "1"], FORK_ENV)
    assert r.returncode == 1, r.stderr
    assert "vLLM API server version" in r.stdout and "flavour vllm-0.33" in r.stdout
    assert "WARNING" in r.stdout and (
        "Unknown vLLM environment variable detected: VLLM_USE_B12X_FP8_GEMM" in r.stdout
    )
    last = r.stderr.splitlines()[-2:]
    assert last[0] == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"
    )
    assert last[1].startswith("  Value error, Unknown quantization method: exl3. Must be one of")
    # the same engine refuses the fork-only flag at argparse, with exit 2
    r2 = run_standin("vllm-0.33", model_dir, ["--mixed-prefill-token-cap", "1"])
    assert r2.returncode == 2
    assert "unrecognized arguments: --mixed-prefill-token-cap 1" in r2.stderr


def test_stock_process_fails_on_fork_env_when_told_to(model_dir: Path) -> None:
    r = run_standin("vllm-0.33", model_dir, ["--fail-on-environ-validation"], FORK_ENV)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        "ValueError: Unknown vLLM environment variable detected: VLLM_USE_B12X_FP8_GEMM"
    )


def test_a_chat_template_that_looks_like_a_path_must_exist(model_dir: Path) -> None:
    """sfxnz-v13's head takes --chat-template /chat_template.jinja: unmounted, vLLM stops before
    it loads anything (validate_parsed_serve_args)."""
    missing = model_dir / "chat_template.jinja"
    r = run_standin("sfxnz-v13", model_dir, ["--chat-template", str(missing)])
    assert r.returncode == 1 and "vLLM API server version" not in r.stdout
    assert r.stderr.splitlines()[-1].startswith(
        "vllm.exceptions.VLLMValidationError: The supplied chat template string "
        f"({missing}) appears path-like, but doesn't exist! Tried: {missing} and "
    )
    missing.write_text("{{ messages }}")  # mounted: it goes on, to the config stage here
    r = run_standin("sfxnz-v13", model_dir, ["--chat-template", str(missing), "-q", "exl3"])
    assert r.returncode == 1 and "Unknown quantization method: exl3" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_never_ready_boots_and_never_opens_its_api(model_dir: Path) -> None:
    port = _free_port()
    environ = {**os.environ, flavours.ENV: "never-ready", "STANDIN_DELAY": "0", **FORK_ENV}
    p = subprocess.Popen(
        [sys.executable, str(STANDIN), "serve", str(model_dir), *ENTRPI_ARGV, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ,
    )  # fmt: skip
    lines: list[str] = []
    hung = threading.Event()

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if "Capturing CUDA graphs (decode, FULL): 0%" in line:
                hung.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert hung.wait(30), lines
        time.sleep(0.5)  # a stand-in that went on would log its API and open the port at once
        assert p.poll() is None, lines
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), 1).close()
        text = "".join(lines)
        assert "Application startup complete" not in text and "Starting vLLM API" not in text
        assert "Unknown vLLM environment variable" not in text
    finally:
        p.terminate()
        assert p.wait(10) == 0  # docker stop's SIGTERM ends it

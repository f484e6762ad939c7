"""The lab's stand-in vLLM as a subprocess on 127.0.0.1, for the bench tests and for
bench/agreement (the timing agreements the suite no longer asserts); `vllm bench serve`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparkrig.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "standin_vllm.py"
MODEL = "glm-5.3-flash"
# vLLM imported as tests/serving imports it: its platform set to the CPU one before anything of
# vLLM reads it (vllm.utils.torch_utils decides pinned memory at import; imported first from here,
# it broke tests/serving's runner tests in the same process); a missing package is a skip
_vllm = load_script("vllm_helpers", REPO / "tests" / "serving" / "vllm_helpers.py")
vllm_cpu, vllm_package = _vllm.vllm_cpu, _vllm.vllm_package


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def standin(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A single-node stand-in serving MODEL with the given flags; yields its base URL."""
    with standin_process(tmp, *flags, env=env) as (url, _):
        yield url


@contextmanager
def standin_process(
    tmp: Path, *flags: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The same, yielding (base URL, the process)."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    port = free_port()
    argv = [
        sys.executable,
        str(STANDIN),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--standin-delay",
        "0",
        *flags,
    ]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while not any("Application startup complete" in ln for ln in lines):
            if p.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("stand-in did not start:\n" + "".join(lines))
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", p
    finally:
        p.kill()
        p.wait(10)


def read_figure(stem: Path) -> tuple[Any, ET.Element]:
    """The bench's figure ``stem``.png and ``stem``.svg, each read as what it claims to be: the
    PNG decoded to an RGBA array (matplotlib's reader, which refuses a broken file), the SVG
    parsed as XML with an <svg> root."""
    from matplotlib import image

    png = stem.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png}: not a PNG"
    pixels = image.imread(png)
    svg = ET.parse(stem.with_suffix(".svg")).getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg", svg.tag
    return pixels, svg


def count_colour(pixels: Any, rgb: tuple[int, int, int]) -> int:
    """Pixels of the decoded PNG within 2/255 of the colour."""
    want = [c / 255 for c in rgb]
    return int((abs(pixels[:, :, :3] - want) < 2 / 255).all(axis=2).sum())


def svg_text(svg: ET.Element) -> str:
    """Everything the SVG says in words (plot.save keeps text as <text> elements)."""
    return " ".join(el.text or "" for el in svg.iter())


def within(measured: float | None, wanted: float, tolerance: float) -> bool:
    return measured is not None and abs(measured - wanted) <= tolerance * wanted


def word_tokenizer(directory: Path, words: int = 2000) -> Path:
    """A Hugging Face tokenizer made here, offline: one token per word "w<i>" (WordLevel), saved
    with save_pretrained so AutoTokenizer (and `vllm bench serve --tokenizer DIR`) load it from
    the directory without the Hub. Its random prompts are "w17 w1203 ..."; the server counts
    them its own way and reports that count in usage."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[EOS]": 1, **{f"w{i}": i + 2 for i in range(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins the words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(str(directory))
    return directory


def vllm_bench_serve(url: str, tokenizer: Path, out: Path, concurrency: int, prompts: int,
                     output_len: int) -> dict[str, Any]:  # fmt: skip
    """`vllm bench serve` (vLLM's own CLI, as `vllm bench serve` runs it), openai-chat backend,
    random prompts from the local tokenizer, forced output length; its saved result."""
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
            "--model", MODEL, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", "32", "--random-output-len", str(output_len),
            "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
            "--ignore-eos", "--temperature", "0", "--num-warmups", "0", "--save-result",
            "--result-dir", str(out), "--result-filename", "result.json"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result

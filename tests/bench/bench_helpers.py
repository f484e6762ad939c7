"""The lab's stand-in vLLM as a subprocess on 127.0.0.1, for the bench tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "lab" / "standin_vllm.py"
MODEL = "glm-5.3-flash"


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

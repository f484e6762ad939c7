#!/usr/bin/env python3
"""Write lab/vllm-flags.txt: every option of `vllm serve` in the installed vLLM, from its own
parser (the pin in requirements-vllm.txt). The lab stand-in refuses any flag not in it, as the real
engine does, so a renamed or removed flag fails in the lab. Also lab/vllm-values.txt: what vLLM
checks later, when it builds the engine config (the quantization methods, the attention backends)
and the VLLM_* environment variables it knows (it warns about others then): the stand-in's stock
flavour refuses and warns at the same stage (lab/standin_flavour.py).

    python3 scripts/extract-vllm-flags.py          # rewrite both files (pin changed)
    python3 scripts/extract-vllm-flags.py --check  # exit 1 if a committed file is stale

vllm-flags.txt, each line: ``<option string> <nargs>`` with nargs 0 (a switch), 1 (one value),
? (optional value), + or * (a list). vllm-values.txt, each line: ``<kind> <value>``.
Needs vllm installed (scripts/install-deps.sh); runs on a CPU-only machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLAGS_FILE = ROOT / "lab" / "vllm-flags.txt"
VALUES_FILE = ROOT / "lab" / "vllm-values.txt"


def serve_parser() -> Any:
    """vLLM's `vllm serve` subparser, built the way `vllm` (entrypoints/cli/main.py) builds it."""
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    if platforms.current_platform.is_unspecified():  # no GPU here: vLLM's own CPU fallback
        platforms.current_platform = CpuPlatform()
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    for cmd in serve.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
    return parser, subparsers.choices["serve"]


def _nargs(action: argparse.Action) -> str:
    return "1" if action.nargs is None else str(action.nargs)


def flag_lines(parser: Any) -> list[str]:
    lines = set()
    for action in parser._actions:  # argparse has no public accessor for its actions
        if isinstance(action, argparse._HelpAction):
            continue
        for opt in action.option_strings:
            lines.add(f"{opt} {_nargs(action)}")
    return sorted(lines)


def render() -> str:
    import vllm

    _, serve = serve_parser()
    head = [
        f"# `vllm serve` options of vllm {vllm.__version__} (the pin in requirements-vllm.txt):",
        "# option, then nargs (0 switch, 1 value, ? optional, + or * list).",
        "# Written by scripts/extract-vllm-flags.py from vLLM's own parser; do not edit.",
    ]
    return "\n".join(head + flag_lines(serve)) + "\n"


def render_values() -> str:
    """vllm-values.txt: the values vLLM 0.33 accepts only when it builds the engine config
    (``ModelConfig`` checks ``--quantization`` against QUANTIZATION_METHODS,
    ``create_engine_config`` looks ``--attention-backend`` up in AttentionBackendEnum) and the
    VLLM_* names of ``vllm.envs`` (``Platform.validate_environ`` warns about any other)."""
    import vllm
    import vllm.envs as envs
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    head = [
        f"# What vllm {vllm.__version__} checks when it builds the engine config, after argparse:",
        "# quantization (ModelConfig: QUANTIZATION_METHODS), attention-backend",
        "# (create_engine_config: AttentionBackendEnum), in this order; env (vllm.envs:",
        "# Platform.validate_environ warns about any other VLLM_* name).",
        "# Written by scripts/extract-vllm-flags.py; do not edit.",
    ]
    lines = [f"quantization {m}" for m in QUANTIZATION_METHODS]
    lines += [f"attention-backend {b}" for b in AttentionBackendEnum.__members__]
    lines += [f"env {name}" for name in sorted(envs.environment_variables)]
    return "\n".join(head + lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    outputs = {FLAGS_FILE: render(), VALUES_FILE: render_values()}
    if args == ["--check"]:
        stale = [path for path, text in outputs.items() if path.read_text() != text]
        for path in stale:
            print(f"{path} is stale: run scripts/extract-vllm-flags.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.write_text(text)
        entries = [ln for ln in text.splitlines() if not ln.startswith("#")]
        print(f"{path.relative_to(ROOT)}: {len(entries)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())

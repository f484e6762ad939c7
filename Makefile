# README quick start: `make deploy-lab`, then `make test`. .ci/run calls `make test`.
PY ?= python3
PKG := sparkrig lab files
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: deps check test unit deploy-lab lab-test lab-down

deps:
	bash scripts/install-deps.sh

check:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy $(PKG)

# Lint, format, types, then unit, plan, image, serving and weights tests (network namespaces
# included). The qemu lab suite is `make lab-test` until it passes in one go every time.
test: deps check
	$(PY) -m pytest -q -rs -m "not lab"

# Without the VM lab (minutes, not tens of minutes).
unit: check
	$(PY) -m pytest -m "not lab" -q

# The operator's command pointed at the embedded default: two qemu VMs standing in for Sparks.
deploy-lab: deps
	$(PY) -m lab up
	pyinfra -y lab/inventory.py deploy.py

# The qemu lab suite (boots VMs; tens of minutes under software emulation).
lab-test: deps check
	SPARKRIG_LAB=1 $(PY) -m pytest -q -rs -m lab

lab-down:
	$(PY) -m lab down

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

# Lint, format, types, then every test: unit, plan, image, serving, weights (network namespaces)
# and the qemu lab suite (boots two VMs and always tears them down; about 20 minutes under TCG).
test: deps check
	SPARKRIG_LAB=1 $(PY) -m pytest -q -rs --durations=12

# Everything but the VM lab (minutes, not tens of minutes): the loop while editing.
unit: check
	$(PY) -m pytest -m "not lab" -q

# The operator's command pointed at the embedded default: two qemu VMs standing in for Sparks.
deploy-lab: deps
	$(PY) -m lab up
	pyinfra -y lab/inventory.py deploy.py

# The qemu lab suite alone.
lab-test: deps check
	SPARKRIG_LAB=1 $(PY) -m pytest -q -rs -m lab --durations=12

lab-down:
	$(PY) -m lab down

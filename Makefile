# The test command (README, .ci/run): lint, format check, types, then every test.
PY ?= python3
PKG := sparkrig lab files
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: test check unit lab-up lab-down

check:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy $(PKG)

unit: check
	$(PY) -m pytest -m "not lab" -q

test: check
	$(PY) -m pytest -q -rs

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

# Three pytest processes, so no suite changes how another runs:
#  1. unit, serving, weights (network namespaces), image: plain threads and sockets;
#  2. the plan tests: they drive pyinfra's CLI in-process, which gevent-patches threading and
#     sockets for the whole process;
#  3. the qemu lab suite (boots the VMs, tears them down when the process ends).
# Lab pieces are deselected (-m "not lab"), never skipped; -rs lists any skip with its reason.
PLAN_TESTS := tests/plan tests/image/test_plan_image.py
PYTEST := $(PY) -m pytest -q -rs -p no:cacheprovider
PYTEST_FAST := $(PYTEST) -m "not lab" tests --ignore=tests/plan --ignore=tests/image/test_plan_image.py
PYTEST_PLAN := $(PYTEST) -m "not lab" $(PLAN_TESTS)

# Lint, format, types, every unit/plan test, then the lab tests CI runs (LAB_CI below). Under
# SPARKRIG_NO_SKIPS=1 a skipped test fails (tests/conftest.py): CI never passes by skipping.
test: export SPARKRIG_NO_SKIPS := 1
# The fast and plan suites run side by side (the first mostly waits on sockets and namespaces,
# the second on the CPU); each one's output is printed whole once both have ended.
test: deps check
	@tmp=$$(mktemp -d); \
	$(PYTEST_FAST) --durations=8 >$$tmp/fast.log 2>&1 & fast=$$!; \
	$(PYTEST_PLAN) --durations=4 >$$tmp/plan.log 2>&1; plan=$$?; wait $$fast; fast=$$?; \
	cat $$tmp/fast.log $$tmp/plan.log; rm -rf $$tmp; [ $$fast -eq 0 ] && [ $$plan -eq 0 ]
	SPARKRIG_LAB=1 $(PYTEST) -m lab tests/lab -k "$(LAB_CI)" --durations=12; rc=$$?; [ "$$SPARKRIG_LAB_KEEP" = 1 ] || $(PY) -m lab down; exit $$rc

# The lab tests CI runs, in the suite's order: everything issue 9 names. The NetworkManager guests,
# a bad inventory reaching no host, --dry --diff, the first converge and what it must leave
# (verify, weights, gates, API key), the no-op second run, a claimed fabric NIC, a dead worker,
# docker restarted on a rank and docker stopped on the worker (issue 27, docs/docker.md), the
# operator's stop, the firmware reset, the --limit worker repair, reboot orders (a) (with a moved
# GID index), (b), (c), (d) and the deploy after them changing nothing. Only in `make lab-test`:
# --limit worker leaving the head alone, the old layout's programs, the second operator, rollback
# and uninstall (about 17 more minutes of lab). Measured: docs/lab.md, "The whole suite, seventh
# session".
LAB_CI := dgx_os_network_stack or bad_inventory or dry_diff or first_converge or \
	converged_hosts_verify or weights_came or four_gates or api_needs or second_run or \
	claimed_fabric or dead_worker or docker_restarted or docker_stopped or stopping_the_head or \
	firmware_reset or limit_worker_repairs or reboot_a or reboot_b or reboot_c or reboot_d or \
	after_every

# Everything but the VM lab (minutes, not tens of minutes): the loop while editing.
unit: check
	$(PYTEST_FAST)
	$(PYTEST_PLAN)

# The operator's command pointed at the embedded default: two qemu VMs standing in for Sparks.
deploy-lab: deps
	$(PY) -m lab up
	pyinfra -y lab/inventory.py deploy.py

# The qemu lab suite alone.
lab-test: deps check
	SPARKRIG_LAB=1 $(PYTEST) -m lab tests/lab --durations=12; rc=$$?; [ "$$SPARKRIG_LAB_KEEP" = 1 ] || $(PY) -m lab down; exit $$rc

lab-down:
	$(PY) -m lab down

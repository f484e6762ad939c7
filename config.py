"""pyinfra configuration: pin the version this deploy is tested with, and fail fast: the
deploy's refusals that need no host are said here, before pyinfra reaches any host."""

from pyinfra import config

from sparkrig.check import refuse_before_connecting

config.REQUIRE_PYINFRA_VERSION = ">=3.10,<3.11"
config.FAIL_PERCENT = 0  # one failed host stops the run: never a half-converged pair
config.CONNECT_TIMEOUT = 60  # slow links and the emulated lab

refuse_before_connecting()  # `python3 -m sparkrig check`'s refusals, offline, exit 1

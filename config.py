"""pyinfra configuration: pin the version this deploy is tested with, and fail fast."""

from pyinfra import config

config.REQUIRE_PYINFRA_VERSION = ">=3.10,<3.11"
config.FAIL_PERCENT = 0  # one failed host stops the run: never a half-converged pair
config.CONNECT_TIMEOUT = 60  # slow links and the emulated lab

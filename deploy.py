"""sparkrig: two or more DGX Sparks from bare DGX OS to a serving GLM-5.3-Flash endpoint.

Usage: pyinfra inventory.py deploy.py [--limit worker] [--dry --diff]
"""

from pyinfra import local

from sparkrig.ordering import refuse_unordered_run

refuse_unordered_run()  # --serial / --no-wait break worker-before-head: refused before any command
local.include("tasks/preflight.py")
local.include("tasks/release.py")
local.include("tasks/host.py")
local.include("tasks/fabric.py")
local.include("tasks/weights.py")
local.include("tasks/image.py")
local.include("tasks/service.py")
local.include("tasks/verify.py")

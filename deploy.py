"""sparkrig: two or more DGX Sparks from bare DGX OS to a serving GLM-5.3-Flash endpoint.

Usage: pyinfra inventory.py deploy.py [--limit worker] [--dry --diff]
"""

from pyinfra import local

from sparkrig.ordering import index_deploy_files, refuse_unordered_run

refuse_unordered_run()  # --serial / --no-wait break worker-before-head: refused before any command
index_deploy_files()  # pyinfra orders operations by their stack: make that a lookup per frame
local.include("tasks/preflight.py")
local.include("tasks/release.py")
local.include("tasks/baseline.py")
local.include("tasks/host.py")
local.include("tasks/firewall.py")
local.include("tasks/fabric.py")
local.include("tasks/weights.py")
local.include("tasks/image.py")
# the service phase, one file per thing it owns, in the order its operations run
local.include("tasks/api_key.py")
local.include("tasks/rank_units.py")
local.include("tasks/helpers.py")
local.include("tasks/stop.py")
local.include("tasks/smoke.py")
local.include("tasks/start.py")
local.include("tasks/legacy.py")
local.include("tasks/front.py")  # nginx before the gates: they go through it
local.include("tasks/verify.py")

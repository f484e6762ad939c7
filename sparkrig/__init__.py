"""sparkrig, the control side. It imports the host package (files/sparkhost) as ``sparkhost``,
through the checkout's ``sparkhost`` link beside this package: the control side runs the very
modules the hosts run (sparkrig/hostpkg.py ships them), instead of keeping copies."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: deploy.py, tasks/, files/, templates/

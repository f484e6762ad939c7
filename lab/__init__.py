"""The sparkrig qemu lab: Debian guests standing in for DGX Sparks, in a network namespace."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB_DIR = REPO / "lab"
STATE_DIR = REPO / ".lab"
STATE_FILE = STATE_DIR / "state.json"
CACHE_DIR = Path("/var/cache/sparkrig-lab")

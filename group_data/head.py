"""Overrides for the head (rank 0) only. A cluster-wide knob set here needs the same value in
worker.py (or comes with --data): sparkrig/config/rules.py refuses one that differs between ranks.
The defaults are group_data/all.py's, made from sparkrig/config/knobs.py."""

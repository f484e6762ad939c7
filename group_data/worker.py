"""Overrides for the workers (ranks 1..N-1) only. A cluster-wide knob set here needs the same
value in head.py (or comes with --data): sparkrig/config/rules.py refuses one that differs
between ranks. The defaults are group_data/all.py's, made from sparkrig/config/knobs.py."""

"""Overrides for the head (rank 0) only. Keep cluster-wide knobs in all.py: settings.py refuses a
cluster-wide knob that differs between ranks."""

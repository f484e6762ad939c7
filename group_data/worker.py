"""Overrides for the workers (ranks 1..N-1) only. Keep cluster-wide knobs in all.py: settings.py
refuses a cluster-wide knob that differs between ranks."""

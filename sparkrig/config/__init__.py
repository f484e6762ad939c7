"""The knobs and the cluster they configure: the one reader of host data (docs/design.md).

Its modules import one way, each only those above it here:
  checks.py     what one knob's value must be (patterns, pins, the known-bad image catalogue)
  knobs.py      every knob declared once: type, bounds, default, what and why (``Knobs``)
  model.py      a rank, the cluster (``Settings``) and what follows from the knobs (the pins)
  rules.py      what the knobs of one host and the whole inventory refuse together
  inventory.py  host data in, ``Settings`` per host out (``build``, ``current``)
  api.py        the head's API as the control machine reaches it (the bench's target)
  generate.py   group_data/all.py and docs/configuration.md's knob table, from knobs.py
"""

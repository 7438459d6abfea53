"""`rlfarm fit-reward`'s stages, each usable alone (no Hydra, no Ray): collect frames with labels, fit a
network to them, write the report. The networks and their file live in rlfarm/rewards/fitted.py."""

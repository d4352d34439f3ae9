"""The fast tier (``pytest -m "not system"``) runs every sweep up to FAST_WORLD_MAX ranks; the
sweeps at more ranks (on a 2-core machine, several ranks per core) run in the full suite only."""
import pytest

FAST_WORLD_MAX = 4


def world_sizes(sizes):
    """`sizes` as pytest parameters, those above FAST_WORLD_MAX marked `system`."""
    return [n if n <= FAST_WORLD_MAX else pytest.param(n, marks=pytest.mark.system)
            for n in sizes]

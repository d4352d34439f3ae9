"""The GPU check's first multi-rank tests (tests/test_gpu.py) run on CPU tensors, as on the GPU
in one shared launch (tests/support/shared_launch.py): their code, their references and their
running back to back in one world are proven here before a GPU runs them."""
import pytest
from shared_launch import Check, launch_checks
from test_gpu import (backend_collectives, check_backend_collectives,
                      check_ddp_hook_against_stock, ddp_hook_against_stock, world2_sweep)

pytestmark = pytest.mark.system  # a stage of the GPU check, whole


def test_the_correctness_stage_on_cpu_in_one_launch():
    checks = [Check("sweep", world2_sweep, ("cpu",)),
              Check("ddp hook", ddp_hook_against_stock, ("cpu",)),
              Check("backend", backend_collectives, ("cpu",))]
    outcomes = launch_checks(2, checks, 300)
    sweep = outcomes["sweep"].values()
    failures = [f for rank_failures, _ in sweep for f in rank_failures]
    assert sweep[0][1] > 1000, sweep[0][1]
    assert not failures, f"{len(failures)} wrong cases, first: " + "\n".join(failures[:10])
    check_ddp_hook_against_stock(outcomes["ddp hook"].values())
    check_backend_collectives(outcomes["backend"].values())

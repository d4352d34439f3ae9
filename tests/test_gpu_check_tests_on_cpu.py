"""The GPU check's first multi-rank tests (tests/test_gpu.py) run on CPU tensors: their code and
their references are proven here before a GPU runs them."""
from launcher import launch
from test_gpu import (backend_collectives, check_backend_collectives,
                      check_ddp_hook_against_stock, ddp_hook_against_stock)


def test_ddp_hook_against_stock_ddp_on_cpu():
    check_ddp_hook_against_stock(launch(2, ddp_hook_against_stock, "cpu", timeout=120))


def test_backend_collectives_on_cpu():
    check_backend_collectives(launch(2, backend_collectives, "cpu", timeout=120))

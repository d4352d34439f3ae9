"""torch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py)
against the "ringcomm" backend, at 2 ranks.

Not collected by pytest itself (the name has no test_ prefix): tests/test_torch_suite.py runs it
in a child process, because the suite configures itself from environment variables (BACKEND,
WORLD_SIZE, TEMP_DIR, INIT_METHOD) that must not leak into the rest of the test session.

    cd tests/support && python -c "import torch_suite; torch_suite.main(['test_all_reduce_sum'])"
"""
import json
import os
import sys
import unittest

os.environ.setdefault("BACKEND", "ringcomm")
os.environ.setdefault("WORLD_SIZE", "2")

import ringcomm  # noqa: E402,F401  registers the backend, here and in every spawned rank
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# What ringcomm offers, declared the way the suite lets a backend declare it (before the suite
# is imported: its decorators read these sets).
for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add("ringcomm")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

class TestRingcommBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Recorder(unittest.TextTestResult):
    """Records each test's outcome by name, for the parent test to report one by one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}

    def _put(self, test, status, detail=""):
        self.outcomes[test._testMethodName] = [status, detail]

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, "passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "skipped", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, "failed", self._exc_info_to_string(err, test))


def main(names, json_path=None):
    """Runs the tests `names`; writes {name: [status, detail]} to json_path if given."""
    suite = unittest.TestSuite(TestRingcommBackend(name) for name in names)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=_Recorder)
    result = runner.run(suite)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result.outcomes, f, indent=1)
    return result

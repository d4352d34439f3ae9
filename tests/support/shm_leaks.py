"""What ringcomm leaves in /dev/shm: segment names carry their creator's pid
("ringcomm-<pid>-r<rank>-..."), so a test can tell its own processes' leftovers from those of
other runs on the machine."""
import os

import pytest

import launcher


def shm_entries():
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith("ringcomm"))


def created_by(entries, pids):
    """The entries whose creator is one of `pids`."""
    return [e for e in entries if int(e.split("-")[1]) in pids]


@pytest.fixture
def nothing_left_in_dev_shm():
    """Fails the test if a process the launcher started during it (or this one) left a
    segment in /dev/shm."""
    first = len(launcher.started_pids)
    yield
    ours = set(launcher.started_pids[first:]) | {os.getpid()}
    assert created_by(shm_entries(), ours) == [], "ringcomm left shared-memory segments behind"

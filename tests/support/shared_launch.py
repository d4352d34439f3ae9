"""Several multi-rank checks in one launch of the ranks, each reported by name.

Starting ranks costs seconds per launch, far more where they use CUDA (a fresh interpreter, torch,
a CUDA context and NCCL's first connection each: 10-15 s), while most checks take a few seconds.
So every multi-rank test of a pytest session that runs on the same number of ranks shares one
launch: the first such test to need its result starts the ranks, they run every selected check
in turn, and each test then reads its own check's outcome and asserts on it.

    @shares_launch(body_fn, extra_arg)          # body_fn(rank, world, extra_arg, **params)
    @pytest.mark.parametrize("world", [2, 4])
    def test_something(world, on_ranks):
        values = on_ranks.values()               # per rank; raises naming the failing rank

The module using it defines a session fixture `shared_launches` returning a SharedLaunches (how
to start the ranks: fork or spawn, their environment).

Each check runs with a default group of its own (a fresh gloo group under its own store prefix)
and ringcomm's rendezvous numbering reset, so a check that failed halfway on one rank leaves no
half-used keys or counters behind for the next. Between checks the ranks meet at a barrier on
the launch's store; every wait has the launch's deadline. Each rank writes each outcome to a
file as soon as it has it, so a launch that hangs or crashes still reports every check before
the one it stopped in, and that one by name.
"""
import datetime
import json
import os
import pickle
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import pytest

from launcher import WorkerError, launch

# Seconds a launch may take when the caller gives no budget (RINGCOMM_TEST_LAUNCH_TIMEOUT): the
# GPU check gives each stage's launch the seconds its plan allows.
DEFAULT_LAUNCH_S = 60
DEFAULT_CHECK_S = 90
# Ranks leave their barriers this long before the parent's deadline, so that a launch where
# only one rank hangs ends with the others' reports written.
RANK_MARGIN_S = 3


class CheckFailed(AssertionError):
    pass


@dataclass
class Check:
    name: str
    fn: object
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def run_checks(rank, world, checks, results_dir, ends_at):
    """launch() worker: every check in turn; rank r's outcome of check i goes to
    results_dir/i.r.pkl the moment it is known. ends_at: the parent's deadline (time.time())."""
    import torch.distributed as dist

    from ringcomm.world import rendezvous

    deadline = time.monotonic() + (ends_at - time.time()) - RANK_MARGIN_S
    base = dist.distributed_c10d._get_default_store()  # the launch's store outlives its group
    # Every rank past the launcher's group set-up before any closes it: gloo fails a peer still
    # connecting to a rank that closed ("Connection closed by peer").
    if not _barrier(base, "launched", rank, world, deadline):
        return
    dist.destroy_process_group()
    for index, check in enumerate(checks):
        outcome = {"started": time.time()}
        try:
            left = max(1.0, deadline - time.monotonic())
            dist.init_process_group("gloo", store=dist.PrefixStore(f"check-{index}/", base),
                                    rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=left))
            # Communicators are numbered in creation order per group name: start again at 0 so
            # that ranks which created different numbers in a failed check agree again.
            rendezvous._instances.clear()
            # Likewise every rank past this group's set-up before one can fail and close it.
            if not _barrier(base, f"ready-{index}", rank, world, deadline):
                raise TimeoutError("peers did not set up this check's group in time")
            value = check.fn(rank, world, *check.args, **check.kwargs)
            outcome.update(ok=True, value=pickle.dumps(value))
        except BaseException:  # everything, assertion failures included, is this check's outcome
            outcome.update(ok=False, error=traceback.format_exc())
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        outcome["seconds"] = time.time() - outcome["started"]
        path = os.path.join(results_dir, f"{index}.{rank}.pkl")
        with open(path + ".tmp", "wb") as f:
            pickle.dump(outcome, f)
        os.replace(path + ".tmp", path)  # the parent never reads half a file
        if not _barrier(base, f"after-{index}", rank, world, deadline):
            return  # a peer is still in this check: nothing more can run together


def _barrier(store, key, rank, world, deadline):
    store.set(f"{key}/{rank}", b"1")
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    try:
        store.wait([f"{key}/{r}" for r in range(world)], datetime.timedelta(seconds=left))
    except Exception:  # the store's own timeout error
        return False
    return True


class Outcome:
    """One check's outcome on every rank of its launch."""

    def __init__(self, check, world, per_rank, ended, stopped_in, out_of_time=False):
        self.check, self.world = check, world
        self.per_rank = per_rank      # rank -> outcome dict, or None where none was written
        self.ended = ended            # why the launch ended early (launch()'s error), or None
        self.stopped_in = stopped_in  # rank -> name of the check it had not finished
        self.out_of_time = out_of_time  # the launch ended at its deadline, not by a crash

    def seconds(self):
        return max((o["seconds"] for o in self.per_rank.values() if o), default=None)

    def passed(self):
        return all(o and o["ok"] for o in self.per_rank.values())

    def values(self):
        """Every rank's return value, by rank. Raises CheckFailed naming the rank that failed
        (with its traceback), or the ranks that never finished the check and why the launch
        ended; where it ended at its deadline with no rank failing this check, the test skips
        as "cut short" instead: like a stage past its limit, not a failure (a hang inside a ring
        fails by itself, at the ring's timeout)."""
        failed = [r for r, o in self.per_rank.items() if o and not o["ok"]]
        failure = ""
        if failed:
            others = f" (ranks {failed[1:]} failed too)" if failed[1:] else ""
            error = self.per_rank[failed[0]]["error"]
            failure = f"rank {failed[0]} of {self.world}{others}:\n{error}"
        missing = [r for r, o in self.per_rank.items() if o is None]
        if missing:  # a crash or a hang: often what made the others fail, so it comes first
            where = "; ".join(f"rank {r} was in {self.stopped_in[r]}" for r in missing
                              if self.stopped_in.get(r) not in (None, self.check))
            what = ("was never reached" if len(missing) == self.world else
                    f"was not finished by ranks {missing} of {self.world}")
            message = (f"{self.check} {what}: the launch ended"
                       + (f" ({where})" if where else "") + f": {self.ended}")
            if self.out_of_time and not failure:
                pytest.skip(f"cut short: {message}")
            raise CheckFailed(message + (f"\nand it failed on {failure}" if failure else ""))
        if failed:
            raise CheckFailed(f"{self.check} failed on {failure}")
        return [pickle.loads(self.per_rank[r]["value"]) for r in range(self.world)]


def launch_checks(world, checks, seconds, log=None, **launch_options):
    """Runs `checks` on `world` ranks in one launch of at most `seconds`; returns {name:
    Outcome}. `log`: a file that gets one JSON line per launch (its start-up time and each
    check's), the measurements a plan of launches is made from."""
    start = time.time()
    with tempfile.TemporaryDirectory() as results_dir:
        try:
            launch(world, run_checks, checks, results_dir, start + seconds, timeout=seconds,
                   **launch_options)
            ended = None
        except WorkerError as error:
            ended = str(error)
        outcomes, stopped_in = {}, {}
        for index, check in enumerate(checks):
            per_rank = {}
            for rank in range(world):
                path = os.path.join(results_dir, f"{index}.{rank}.pkl")
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        per_rank[rank] = pickle.load(f)
                else:
                    per_rank[rank] = None
                    stopped_in.setdefault(rank, check.name)
            outcomes[check.name] = Outcome(check.name, world, per_rank, ended, stopped_in)
        if stopped_in and ended is None:  # every rank returned, some gave up at a barrier
            ended = "ranks gave up waiting for peers still in a check"
        # Barriers give up RANK_MARGIN_S before the deadline: that too is running out of time.
        out_of_time = time.time() - start >= seconds - RANK_MARGIN_S - 1
        for outcome in outcomes.values():
            outcome.ended, outcome.out_of_time = ended, out_of_time and ended is not None
    if log:
        _log_launch(log, world, start, outcomes, ended)
    return outcomes


def _log_launch(log, world, start, outcomes, ended):
    starts = [o["started"] for out in outcomes.values() for o in out.per_rank.values() if o]
    line = {"world": world, "seconds": round(time.time() - start, 2),
            # From starting the ranks to the first check: interpreters, imports, the group.
            "start_up_s": round(min(starts) - start, 2) if starts else None,
            "checks": {name: {"seconds": out.seconds() and round(out.seconds(), 2),
                              "passed": out.passed()} for name, out in outcomes.items()},
            "ended": ended,
            "out_of_time": any(out.out_of_time for out in outcomes.values())}
    with open(log, "a") as f:
        f.write(json.dumps(line) + "\n")


# -- pytest: which selected tests share which launch ---------------------------------------------

def shares_launch(fn, *args, world=None):
    """Marks a test whose work, fn(rank, world, *args, **params), runs in the launch its session
    shares at `world` ranks (default: the test's `world` parameter); `params` are the test's
    other parameters. pytest-timeout then times only the test itself: the shared launch it may
    start in its set-up has its own deadline."""
    def mark(test):
        test = pytest.mark.timeout(func_only=True)(test)
        return pytest.mark.shared_launch(fn, *args, world=world)(test)
    return mark


class SharedLaunches:
    """One launch per world size for every selected test marked by shares_launch, started when
    the first of them asks for its outcome. launch_options go to launcher.launch (start_method,
    env); seconds: each launch's budget (default RINGCOMM_TEST_LAUNCH_TIMEOUT, else a minute
    plus 90 s per check), never past RINGCOMM_TEST_ENDS_AT (a time.time() by which the tests
    must be reporting: the GPU check's stage limit); log: RINGCOMM_TEST_LAUNCH_LOG."""

    def __init__(self, session, seconds=None, log=None, **launch_options):
        self.session = session
        self.seconds = seconds or os.environ.get("RINGCOMM_TEST_LAUNCH_TIMEOUT")
        self.log = log or os.environ.get("RINGCOMM_TEST_LAUNCH_LOG")
        self.launch_options = launch_options
        self.launched = {}

    @staticmethod
    def check_of(item):
        """(world, Check) of a marked test item, else None."""
        marker = item.get_closest_marker("shared_launch")
        if marker is None:
            return None
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec else {}
        world = marker.kwargs.get("world") or params.get("world")
        if world is None:
            raise TypeError(f"{item.nodeid}: shares_launch needs world= or a `world` parameter")
        params.pop("world", None)
        return world, Check(item.nodeid, marker.args[0], tuple(marker.args[1:]), params)

    def outcome(self, item):
        world, check = self.check_of(item)
        if world not in self.launched:
            checks = [self.check_of(i)[1] for i in self.session.items
                      if self.check_of(i) and self.check_of(i)[0] == world and not _skipped(i)]
            seconds = float(self.seconds or DEFAULT_LAUNCH_S + DEFAULT_CHECK_S * len(checks))
            if os.environ.get("RINGCOMM_TEST_ENDS_AT"):  # the caller's deadline (time.time())
                seconds = max(1.0, min(seconds, float(os.environ["RINGCOMM_TEST_ENDS_AT"])
                                       - time.time()))
            print(f"one launch of {world} ranks for {len(checks)} checks, at most {seconds:.0f} s",
                  flush=True)
            self.launched[world] = launch_checks(world, checks, seconds, self.log,
                                                 **self.launch_options)
        return self.launched[world][check.name]


def _skipped(item):
    """Whether a skip or skipif marker with a plain True condition skips the item: its check
    would only waste the launch's time (string conditions are left to pytest)."""
    if item.get_closest_marker("skip"):
        return True
    return any(m.args and all(a is True for a in m.args) for m in item.iter_markers("skipif"))


@pytest.fixture
def on_ranks(request, shared_launches):
    """The Outcome of this test's check in its shared launch."""
    return shared_launches.outcome(request.node)

"""Set-up epochs: store keys that no earlier set-up has used.

A store can outlive the processes that use it: torchrun keeps one store across the restarts of
a job, and a long-lived TCPStore may serve one group of processes after another. Keys that only
name the group and the communicator's number are then the same for every set-up, and a rank
would read what a dead process published (a shared-memory name long gone, a barrier already
passed). Two guards keep every value a rank reads its own set-up's:

- the attempt (:func:`attempt`): torchrun's run id and restart count, where set, name the keys;
- the epoch (:func:`agree`): at set-up the ranks agree through the store on a number that no
  set-up on the same keys had before, and every later key carries it. Rank 0 draws it (an
  atomic add) and hands it to each other rank under a key named after a nonce that rank made
  up: a request an earlier process left behind is answered too, but nobody waits for that
  answer, and rank 0 goes on reading requests until every rank has confirmed under the new
  epoch, which no earlier process can have written to.
"""
import datetime
import os
import socket
import time
import uuid

from .. import _C

# Rank 0 looks for fresh requests this often at first, backing off to the longest.
_FIRST_LOOK_S, _LONGEST_LOOK_S = 0.01, 0.5


def attempt():
    """"<run id>.<restart count>" under torchrun (TORCHELASTIC_RUN_ID and
    TORCHELASTIC_RESTART_COUNT), else "-"."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        return "-"
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', '-')}.{restart}"


def agree(store, rank, world_size, timeout, what):
    """The epoch every rank of one set-up gets, from a store that holds the keys of one
    communicator (a PrefixStore); every rank calls it together. `what` names the communicator
    in errors; raises ringcomm's CommTimeoutError after `timeout` seconds, saying which rank
    never came and whether the store held only an earlier process's request for its place."""
    deadline = time.monotonic() + timeout
    if rank == 0:
        return _lead(store, world_size, deadline, timeout, what)
    return _follow(store, rank, deadline, timeout, what)


def _me():
    return f"{os.getpid()} {socket.gethostname()}"


def _follow(store, rank, deadline, timeout, what):
    nonce = uuid.uuid4().hex
    store.set(f"request/{rank}", f"{nonce} {_me()}")
    answer = f"answer/{nonce}"
    if not _wait(store, [answer], deadline):
        raise _timeout(f"rank {rank} timed out after {timeout} s waiting for rank 0 to start "
                       f"the set-up of {what}: no rank 0 of this set-up has come (a missing "
                       f"peer, or one that runs another attempt of the job)")
    epoch = int(store.get(answer))
    store.set(f"{epoch}/joined/{rank}", nonce)
    return epoch


def _lead(store, world_size, deadline, timeout, what):
    epoch = store.add("epochs", 1)
    answered = {}  # rank -> the request answered last
    waiting = set(range(1, world_size))
    look = _FIRST_LOOK_S
    while waiting:
        requests = [f"request/{r}" for r in sorted(waiting)]
        if not _wait(store, requests, deadline):
            missing = [r for r in sorted(waiting) if not store.check([f"request/{r}"])]
            raise _timeout(f"rank 0 timed out after {timeout} s waiting for {_ranks(missing)} "
                           f"to start the set-up of {what}: no process has come in that place "
                           f"(a missing peer, or one that runs another attempt of the job)")
        for r in waiting:
            request = store.get(f"request/{r}").decode()
            if answered.get(r) != request:  # a new process asks (or the first look)
                store.set(f"answer/{request.split()[0]}", str(epoch))
                answered[r] = request
        # Confirmations can only come from processes that got this epoch, i.e. this set-up's.
        waiting = _unconfirmed(store, epoch, waiting, min(deadline, time.monotonic() + look))
        look = min(2 * look, _LONGEST_LOOK_S)
        if waiting and time.monotonic() > deadline:
            stale = "; ".join(_stale(r, answered[r]) for r in sorted(waiting))
            raise _timeout(f"rank 0 timed out after {timeout} s waiting for "
                           f"{_ranks(sorted(waiting))} to join the set-up of {what}: {stale}")
    return epoch


def _unconfirmed(store, epoch, ranks, until):
    """The ranks of `ranks` that have not confirmed `epoch` by `until`. Polls: a store's wait
    with a short timeout logs a warning each time it runs out (TCPStore)."""
    pause = 0.001
    while True:
        ranks = {r for r in ranks if not store.check([f"{epoch}/joined/{r}"])}
        if not ranks or time.monotonic() >= until:
            return ranks
        time.sleep(pause)
        pause = min(2 * pause, 0.02)


def _stale(rank, request):
    """Why the process that made `request` (a request for `rank`'s place) never joined."""
    _, pid, host = request.split(maxsplit=2)
    if host != socket.gethostname():
        state = "on another host"
    elif _running(int(pid)):
        state = "still running, but it never took up the answer"
    else:
        state = "which has exited"
    return (f"the only request for rank {rank}'s place came from process {pid} on {host}, "
            f"{state}: a process of an earlier set-up on this store (a stale peer, e.g. of an "
            f"earlier attempt of the job), and none of this set-up has come")


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _wait(store, keys, deadline):
    """Whether every key of `keys` is set by `deadline` (store.wait raises on its timeout)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return store.check(keys)
    try:
        store.wait(keys, datetime.timedelta(seconds=remaining))
        return True
    except Exception:  # the store's own timeout error; whatever else went wrong, check
        return store.check(keys)


def _timeout(message):
    return _C.CommTimeoutError(message)

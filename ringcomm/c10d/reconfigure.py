"""torch's reconfigure API on the ringcomm backend: a group shrinks or grows while its processes
run on (``dist._get_reconfigure_handle``, ``dist._reconfigure(uuid, handles, timeout)``).

A handle names one process: ``ringcomm:<host>:<pid>:<token>``. Each is recorded in the group's
store when the backend is built, so a handle that this store never saw (another group's, a
typo) is refused at once. A reconfigure then

1. closes the current communicator once its queued calls have run (a peer's failure has aborted
   it already, and an abort() from any thread ends a call that waits on a dead peer); it stays
   unusable if the reconfigure fails. Aborting it here instead would fail peers that are still
   finishing the last collective this rank has finished;
2. claims its uuid for its member list in the store (a uuid used before, by this process or for
   other members, is refused: its keys would mix with the old configuration's);
3. waits, up to the timeout, for every member to arrive, naming those that did not;
4. builds a new communicator whose rank is this handle's place in the list (a set: sorted).
"""
import datetime
import os
import secrets
import socket

from .. import _C
from ..communicator import Communicator
from ..world.rendezvous import Rendezvous, timeout_seconds

_MEMBERS = "ringcomm/handles/"
_RECONFIGURE = "ringcomm/reconfigure/"


class Unconfigured:
    """The communicator of a group made with ``enable_reconfigure=True`` before its first
    reconfigure: every use says so."""

    def default_algorithm(self, collective):
        return None

    def abort(self, why=None):
        pass

    def close(self):
        pass

    def __getattr__(self, name):
        raise RuntimeError("ringcomm backend: this group was made with enable_reconfigure=True and "
                           "has no communicator until torch.distributed._reconfigure(uuid, "
                           "handles) has built one")


class Membership:
    """This process's handle in a group's store, and the reconfigures it takes part in."""

    def __init__(self, store, timeout):
        self.store, self.timeout = store, timeout_seconds(timeout)
        self.handle = f"ringcomm:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
        self.store.set(_MEMBERS + self.handle, b"1")
        self._used = set()

    def reconfigure(self, opts, current):
        """Aborts `current` and returns (communicator, rank, world size) for `opts`'s members.
        The current communicator is gone even if this raises: its members are reconfiguring."""
        uuid = int(opts.uuid)
        current.close()  # after what is queued; a peer's failure has aborted it already
        handles = self._members(opts.handles)
        timeout = self.timeout if opts.timeout is None else timeout_seconds(opts.timeout)
        self._claim(uuid, handles)
        keys = _RECONFIGURE + f"{uuid}/arrived/"
        self.store.set(keys + self.handle, b"1")
        self._await_members(keys, handles, uuid, timeout)
        rank = handles.index(self.handle)
        rendezvous = Rendezvous.from_store(self.store, rank, len(handles), self.timeout,
                                           name=f"reconfigured-{uuid}", number=0)
        return Communicator(rendezvous), rank, len(handles)

    def _members(self, handles):
        """The member list: as given (a list), or sorted (a set), checked."""
        members = list(handles) if isinstance(handles, (list, tuple)) else sorted(handles)
        if len(set(members)) != len(members):
            raise RuntimeError(f"ringcomm reconfigure: a handle is listed twice in {members}")
        if self.handle not in members:
            raise RuntimeError(f"ringcomm reconfigure: this process's handle {self.handle} is not "
                             f"among the {len(members)} handles given")
        foreign = [h for h in members if not self.store.check([_MEMBERS + h])]
        if foreign:
            raise RuntimeError(f"ringcomm reconfigure: handle(s) {foreign} were not issued by "
                             "this group's store (another group's, or not ringcomm's)")
        return members

    def _claim(self, uuid, handles):
        listed = "\n".join(handles)
        if uuid in self._used:
            raise RuntimeError(f"ringcomm reconfigure: uuid {uuid} was already used by this "
                             "process: pass a fresh one on every reconfigure")
        held = self.store.compare_set(_RECONFIGURE + f"{uuid}/members", "", listed)
        held = held.decode() if isinstance(held, bytes) else held
        if held != listed:
            raise RuntimeError(f"ringcomm reconfigure: uuid {uuid} was already used for other "
                             f"members ({held.splitlines()}): pass a fresh one")
        self._used.add(uuid)

    def _await_members(self, keys, handles, uuid, timeout):
        try:
            self.store.wait([keys + h for h in handles], datetime.timedelta(seconds=timeout))
        except Exception as error:  # the store's own kinds; name who is missing
            missing = [f"rank {r} ({h})" for r, h in enumerate(handles)
                       if not self.store.check([keys + h])]
            raise _C.CommTimeoutError(
                f"ringcomm reconfigure (uuid {uuid}): after {timeout} s, "
                f"{', '.join(missing) or 'a member'} had not arrived: {error}") from error

"""Lose a rank and go on: DDP on 3 CPU ranks, one killed (SIGKILL) mid-training, the survivors
shrink the same process group to 2 ranks and keep training from their in-memory state.

    python examples/lose_a_rank.py                     # ringcomm, rank 1 killed at step 10
    python examples/lose_a_rank.py --backend gloo      # the same on gloo, to compare
    python examples/lose_a_rank.py --steps 40 --kill-at 25 --victim 2

Needs torch's reconfigure API (torch 2.14 or later): the group is created with
``init_process_group(..., enable_reconfigure=True)`` and (re)configured with
``dist._reconfigure(uuid, handles)``, where the handles come from ``dist._get_reconfigure_handle()``
and their order gives the ranks.

The script starts its own processes around a TCP store that it keeps (so the store outlives any
rank; torchrun would stop the whole job on a lost worker). Each process is a *member* with a
fixed number (0, 1, 2, ...); its rank is its place among the members of the current
*generation*.
The victim kills itself during the backward pass of step ``--kill-at``, after its first gradient
buckets went out, so the survivors' collective raises in flight. Each survivor then:

1. aborts the group (on ringcomm this also fails the calls that peers wait in on it);
2. joins the next generation: writes its reconfigure handle and its step under the store;
3. waits for a quorum: every member of the last generation has either joined or is known dead
   (same host, and its pid is gone or a zombie, or was reused by another process: each member
   published host, pid and process start time when it started). A member that runs on without
   joining (or runs on another host, where it cannot be seen dying) counts as dead after twice
   ``--timeout``: a collective it is blocked in fails within ``--timeout`` of its start;
4. proposes the joined members as the generation's member list with the store's compare-and-set:
   the first proposal wins and everyone reads the same list back, so the survivors agree even
   if their views raced (a member that joins after the decision is not in it and stops);
5. reconfigures the group to those members (uuid: the generation), wraps the model in a new DDP
   and redoes the failed step. The global batch stays the same: the survivors share the lost
   rank's samples.

How soon a survivor notices depends on the backend. On gloo, a survivor learns of the loss when
its connection to the dead process breaks; one that is waiting on another survivor at that moment
(a collective is a chain of messages) learns nothing more until its own timeout, as gloo's abort
does not reach the peers. On ringcomm, the shared-memory transport checks on the process it waits
for, and an abort fails the calls its peers are waiting in.

At the end the survivors' parameters are compared bitwise (checksums through the store), and the
script prints the time from the kill to the survivors' next completed step, broken down into
noticing the failure, agreeing on the members, reconfiguring and the step itself. It exits
non-zero if anything went otherwise.
"""
import argparse
import hashlib
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringcomm  # noqa: F401  (registers the "ringcomm" backend)

UNSUPPORTED = 3  # a member's exit code when the backend cannot reconfigure


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="ringcomm", choices=("ringcomm", "gloo"))
    p.add_argument("--ranks", type=int, default=3, help="processes at the start")
    p.add_argument("--steps", type=int, default=30, help="training steps in all")
    p.add_argument("--kill-at", type=int, default=10, help="the step during which the victim dies")
    p.add_argument("--victim", type=int, default=1, help="the member that dies")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds allowed for a collective, a quorum or a reconfiguration")
    p.add_argument("--width", type=int, default=256, help="hidden layer width")
    p.add_argument("--batch", type=int, default=96, help="samples per step, over all ranks")
    p.add_argument("--bucket-cap-mb", type=float, default=0.1,
                   help="DDP bucket size (small, so a step sends several buckets)")
    args = p.parse_args(argv)
    if args.ranks < 2 or not 0 <= args.victim < args.ranks:
        p.error("needs --ranks 2 or more and 0 <= --victim < --ranks")
    if not 0 < args.kill_at < args.steps:
        p.error("needs 0 < --kill-at < --steps")
    return args


def make_model(args):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width),
                         nn.ReLU(), nn.Linear(args.width, 10))


def batch(args, step, rank, world_size):
    """This rank's share of step `step`'s global batch: the same samples whoever is left."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(args.batch, 64, generator=g)
    y = (x[:, :10] > 0).float().argmax(1)
    return x.tensor_split(world_size)[rank], y.tensor_split(world_size)[rank]


# -- who is alive ----------------------------------------------------------------------------------

def identity():
    """What another process needs to tell whether this one still runs."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid())}


def _start_time(pid):
    """The process's start time in clock ticks since boot (/proc), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return None if fields[0] in "ZX" else int(fields[19])  # a zombie has finished running


def is_gone(who):
    """True if the process `who` (an identity()) has certainly ended; False if it runs or if it
    cannot be known from here (another host)."""
    if who["host"] != socket.gethostname():
        return False
    if who["start"] is None:  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(who["pid"], 0)
        except ProcessLookupError:
            return True
        return False
    # Gone, a zombie, or the pid reused by a newer process.
    return _start_time(who["pid"]) != who["start"]


# -- agreeing on the members -----------------------------------------------------------------------

def agree(store, generation, candidates, me, joining, *, deadline):
    """Joins `generation` with `joining` (a dict) and returns (members, their joins): the members
    of `candidates` that joined, once every candidate has joined or is known dead."""
    key = f"gen{generation}"
    store.set(f"{key}/joined/{me}", json.dumps(joining))
    identities = {m: json.loads(store.get(f"member/{m}")) for m in candidates}
    while not store.check([f"{key}/members"]):
        joined, undecided = [], False
        for m in candidates:
            if store.check([f"{key}/joined/{m}"]):
                joined.append(m)
            elif not is_gone(identities[m]) and time.monotonic() < deadline:
                undecided = True
        if not undecided:
            # The first proposal wins: a survivor whose view raced reads this one back.
            store.compare_set(f"{key}/members", "", json.dumps(joined))
            break
        time.sleep(0.001)  # a poll interval: the quorum ends on an event, not on a timer
    members = json.loads(store.get(f"{key}/members"))
    return members, [json.loads(store.get(f"{key}/joined/{m}")) for m in members]


# -- one member ------------------------------------------------------------------------------------

def member(me, args, port_reader):
    torch.set_num_threads(1)
    port = port_reader.recv()
    timeout = timedelta(seconds=args.timeout)
    root = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    store = dist.PrefixStore("job", root)  # this script's keys, apart from the backend's
    store.set(f"member/{me}", json.dumps(identity()))
    dist.init_process_group(args.backend, store=dist.PrefixStore("pg", root), rank=me,
                            world_size=args.ranks, timeout=timeout, enable_reconfigure=True)
    group = dist.group.WORLD
    if not dist._supports_reconfigure():
        if me == 0:
            store.set("unsupported", "1")
        os._exit(UNSUPPORTED)  # nothing to clean up: the group never ran a collective

    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    members, generation, ddp, step = list(range(args.ranks)), 0, None, 0
    events, failure, noticed, before = [], None, None, None
    while step < args.steps:
        try:
            if ddp is None:
                generation += 1
                old = members
                members, joins = agree(store, generation, old, me, {
                    "handle": dist._get_reconfigure_handle(), "step": step},
                    # A live member blocked in a collective joins once that fails, within
                    # --timeout of its start; it may have started one just before this join.
                    deadline=time.monotonic() + 2 * args.timeout)
                if me not in members:
                    raise Stop(f"generation {generation} was decided without this member (it "
                               f"joined after twice --timeout)")
                if {j["step"] for j in joins} != {step}:
                    raise Stop(f"the members of generation {generation} stopped at different "
                               f"steps: {[j['step'] for j in joins]}")
                if failure is not None and members == old:
                    raise Stop("a collective failed but every member is still alive") from failure
                agreed = time.time()
                dist._reconfigure(generation, [j["handle"] for j in joins], timeout=timeout).wait()
                # A new DDP over the reconfigured group rather than the old one: the failed step
                # left the old DDP's reducer in the middle of a backward pass, and DDP is built
                # for one membership (its buckets, its gradient averaging). Its constructor
                # broadcasts the new rank 0's parameters, already identical on every survivor.
                ddp = DDP(model, process_group=group, bucket_cap_mb=args.bucket_cap_mb)
                if failure is not None:
                    events.append({"generation": generation, "members": members,
                                   "noticed": noticed, "agreed": agreed,
                                   "reconfigured": time.time(), "error": _first_line(failure)})
                failure = None
            if me == args.victim and step == args.kill_at:
                die_during_backward(store, model)
            x, y = batch(args, step, dist.get_rank(), dist.get_world_size())
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
        except RuntimeError as error:  # gloo's broken connection, ringcomm's PeerError, a timeout
            # The step (or the regrouping) failed: no optimizer step was taken, so the model is
            # as the last completed step left it, on every survivor.
            noticed, failure = time.time(), error
            before = step if before is None else before
            group.abort()
            ddp = None
            continue
        if events and "next_step" not in events[-1]:
            events[-1]["next_step"] = time.time()
        step += 1

    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    store.set(f"result/{me}", json.dumps({
        "events": events, "before": before, "after": step - (before or 0), "loss": loss.item(),
        "rank": dist.get_rank(), "world_size": dist.get_world_size(),
        "sha256": digest.hexdigest()}))
    dist.destroy_process_group()


class Stop(Exception):
    """Something this example does not recover from."""


def _first_line(error):
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def die_during_backward(store, model):
    """SIGKILL this process once the first layer's gradient is ready: the last one of the backward
    pass, when every other gradient bucket has been handed to the backend."""
    def hook(param):
        store.set("killed_at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    model[0].weight.register_post_accumulate_grad_hook(hook)


def _member_main(me, args, port_reader):
    try:
        member(me, args, port_reader)
    except BaseException:
        print(f"member {me} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(1)


# -- the launcher ----------------------------------------------------------------------------------

def main(args):
    if not hasattr(dist, "_reconfigure"):
        sys.exit(f"This example needs torch.distributed's reconfigure API (dist._reconfigure, "
                 f"torch 2.14 or later); this is torch {torch.__version__}.")
    # torch imports much on first use (the first optimizer takes seconds): once here, before
    # the fork, rather than in every member at once.
    torch.optim.SGD(make_model(args).parameters(), lr=0.05, momentum=0.9)
    # Fork the members first, then start the store here, so no member inherits its socket or
    # its thread; each member reads the port from a pipe.
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(args.ranks)]
    procs = [ctx.Process(target=_member_main, args=(m, args, pipes[m][0]))
             for m in range(args.ranks)]
    for p in procs:
        p.start()
    root = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=args.timeout))
    for _, writer in pipes:
        writer.send(root.port)
    deadline = time.monotonic() + 6 * args.timeout + 60
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    late = [m for m, p in enumerate(procs) if p.exitcode is None]
    for m in late:
        procs[m].kill()
        procs[m].join()
    return report(args, dist.PrefixStore("job", root), [p.exitcode for p in procs], late)


def report(args, store, codes, late):
    """Prints what happened; returns the exit status (0: all as expected)."""
    if store.check(["unsupported"]):
        print(f"The {args.backend} backend cannot reconfigure a process group on this torch "
              f"(dist._supports_reconfigure() is False).", file=sys.stderr)
        return 1
    problems = [f"member {m} did not finish within the time allowed" for m in late]
    for m, code in enumerate(codes):
        expected = -9 if m == args.victim else 0
        if m not in late and code != expected:
            problems.append(f"member {m} exited with {code}, expected {expected}")
    survivors = [m for m in range(args.ranks) if m != args.victim]
    results = {m: json.loads(store.get(f"result/{m}")) for m in survivors
               if store.check([f"result/{m}"])}
    if len(results) != len(survivors) or not store.check(["killed_at"]):
        problems.append("not every survivor finished training" if store.check(["killed_at"])
                        else f"member {args.victim} never reached step {args.kill_at}")
        return _fail(problems)
    killed_at = float(store.get("killed_at"))

    print(f"{args.ranks} ranks on {args.backend}, torch {torch.__version__}, {args.steps} steps; "
          f"member {args.victim} killed (SIGKILL) during the backward pass of step {args.kill_at}")
    for m, r in results.items():
        events = r["events"]
        if len(events) != 1:
            problems.append(f"member {m} reconfigured {len(events)} times after the start, "
                            f"expected once")
            continue
        e = events[0]
        print(f"  member {m}: noticed after {_ms(e['noticed'] - killed_at)} ({e['error'][:160]})")
        print(f"  member {m}: generation {e['generation']}: members {e['members']}, now rank "
              f"{r['rank']} of {r['world_size']}; agreed after {_ms(e['agreed'] - killed_at)}, "
              f"reconfigured after {_ms(e['reconfigured'] - killed_at)}, next step done after "
              f"{_ms(e['next_step'] - killed_at)}")
    if problems:
        return _fail(problems)
    first = next(iter(results.values()))
    recovered = max(r["events"][0]["next_step"] for r in results.values()) - killed_at
    print(f"time from the kill to the survivors' next completed step: {_ms(recovered)}")
    print(f"steps: {first['before']} on {args.ranks} ranks before the kill, {first['after']} on "
          f"{first['world_size']} ranks after; final loss {first['loss']:.4f}")
    if len({(r["before"], r["after"]) for r in results.values()}) != 1:
        problems.append("the survivors counted their steps differently")
    if first["before"] != args.kill_at or first["world_size"] != len(survivors):
        problems.append(f"expected {args.kill_at} steps before the kill and {len(survivors)} "
                        f"ranks after it")
    digests = {r["sha256"] for r in results.values()}
    if len(digests) == 1:
        print(f"survivors' parameters: bitwise identical (sha256 {first['sha256'][:16]})")
    else:
        problems.append("survivors' parameters differ")
    return _fail(problems) if problems else 0


def _ms(seconds):
    return f"{seconds * 1e3:.1f} ms"


def _fail(problems):
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(parse_args()))

"""A training job that loses a rank, run by tests/test_restarts.py under torchrun or as plain
processes on a store the test keeps.

Every rank trains the same linear model for --steps steps on data of its own, averaging
gradients over the ranks, either through DDP on the ringcomm backend (--mode ddp) or with
ringcomm.Communicator built on the launcher's store (--mode communicator). In the attempt named
by --die, that rank ends its process at that step (os._exit: no clean-up of any kind).

Everything is exact in float32: weights start at multiples of 1/8, gradients are integers (the
loss is linear) and the learning rate is 1/16, so every rank of a complete attempt must end
with exactly `expected_weights(...)`. Each rank writes <out>/pids/<pid> when it starts, and
<out>/a<attempt>-r<rank>.json (its weights) when it finishes or what it raised when it fails."""
import argparse
import json
import os
import sys
import traceback

IN, OUT, BATCH = 4, 2, 8
LR = 1 / 16


def initial_weights():
    return [[(o * IN + i) / 8 for i in range(IN)] for o in range(OUT)], [0.0] * OUT


def rank_input(rank, step):
    """This rank's batch at `step`: every row the same small integers."""
    return [[float(rank + step + i) for i in range(IN)] for _ in range(BATCH)]


def output_scale(rank):
    """The loss is sum(output * scale): its gradients do not depend on the weights."""
    return [float(rank + 1 + o) for o in range(OUT)]


def expected_weights(world_size, steps):
    """The weights and bias every rank ends with after `steps` averaged SGD steps (floats that
    float32 holds exactly)."""
    weight, bias = initial_weights()
    for step in range(steps):
        grad_w = [[0.0] * IN for _ in range(OUT)]
        grad_b = [0.0] * OUT
        for rank in range(world_size):
            x, c = rank_input(rank, step), output_scale(rank)
            for o in range(OUT):
                grad_b[o] += c[o] * BATCH / world_size
                for i in range(IN):
                    grad_w[o][i] += c[o] * sum(row[i] for row in x) / world_size
        weight = [[weight[o][i] - LR * grad_w[o][i] for i in range(IN)] for o in range(OUT)]
        bias = [bias[o] - LR * grad_b[o] for o in range(OUT)]
    return weight, bias


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "communicator"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--die", default="", help="attempt:rank:step at which a rank exits")
    parser.add_argument("--attempt", type=int, help="without torchrun: this attempt's number")
    args = parser.parse_args()
    os.makedirs(os.path.join(args.out, "pids"), exist_ok=True)
    open(os.path.join(args.out, "pids", str(os.getpid())), "w").close()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = args.attempt
    if attempt is None:
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    die = tuple(int(v) for v in args.die.split(":")) if args.die else None
    report = os.path.join(args.out, f"a{attempt}-r{rank}.json")
    try:
        weight, bias = train(args.mode, rank, world_size, attempt, args.steps, die)
        result = {"weight": weight, "bias": bias}
    except BaseException as error:  # the survivors of a lost rank: say what they saw
        result = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
        with open(report, "w") as f:
            json.dump(result, f)
        raise
    with open(report, "w") as f:
        json.dump(result, f)


def train(mode, rank, world_size, attempt, steps, die):
    import torch
    import torch.distributed as dist

    import ringcomm

    model = torch.nn.Linear(IN, OUT)
    weight, bias = initial_weights()
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight))
        model.bias.copy_(torch.tensor(bias))
    if mode == "ddp":
        dist.init_process_group("ringcomm")
        assert dist.get_backend() == "ringcomm"
        trained, comm = torch.nn.parallel.DistributedDataParallel(model), None
    else:  # the launcher's store, which outlives the processes that use it
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False)
        trained, comm = model, ringcomm.Communicator.from_store(store, rank, world_size,
                                                                timeout=60)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scale = torch.tensor(output_scale(rank))
    for step in range(steps):
        if die == (attempt, rank, step):
            sys.stdout.flush()
            os._exit(3)
        optimizer.zero_grad()
        (trained(torch.tensor(rank_input(rank, step))) * scale).sum().backward()
        if comm is not None:
            for p in model.parameters():
                comm.all_reduce(p.grad, op="avg")
        optimizer.step()
    if comm is not None:
        comm.close()
    else:
        dist.destroy_process_group()
    return model.weight.tolist(), model.bias.tolist()


if __name__ == "__main__":
    main()

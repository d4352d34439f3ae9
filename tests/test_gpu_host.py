"""Host-side logic of the GPU path, checked without a GPU: the NCCL-id rendezvous across ranks
on different devices (real processes and a real store; only the CUDA calls are stand-ins)."""
import pytest

from launcher import launch


class _FakeCudaC:
    """Stands in for the CUDA half of ringcomm._C: records what create() passes on."""

    RingcommError = RuntimeError

    def __init__(self, rank):
        self.rank = rank
        self.ids_made = 0

    def build_info(self):
        return {"cuda": True}

    def cuda_available(self):
        return True

    def nccl_unique_id(self, hint):
        self.ids_made += 1
        return b"id-%d-from-rank-%d" % (self.ids_made, self.rank)

    def CudaCommunicator(self, rank, world_size, device, unique_id, **options):
        return {"rank": rank, "world_size": world_size, "device": device, "id": unique_id}


def _create_on_own_device(rank, world_size):
    from ringcomm import cuda_backend
    from ringcomm.rendezvous import Rendezvous

    cuda_backend._C = _FakeCudaC(rank)  # this worker process only
    rendezvous = Rendezvous(None, timeout=20)
    # Rank r drives device r, as on a multi-GPU node; a second CUDA backend gets ordinal 1.
    first = cuda_backend.create(rendezvous, device_index=rank)
    second = cuda_backend.create(rendezvous, device_index=world_size + rank, ordinal=1)
    return first, second


@pytest.mark.parametrize("world", [2, 3])
def test_nccl_id_is_keyed_by_communicator_not_device(world):
    results = launch(world, _create_on_own_device, timeout=60)
    for rank, (first, second) in enumerate(results):
        assert first["device"] == rank and second["device"] == world + rank
        assert (first["id"], second["id"]) == (b"id-1-from-rank-0", b"id-2-from-rank-0")
        assert (first["rank"], first["world_size"]) == (rank, world)

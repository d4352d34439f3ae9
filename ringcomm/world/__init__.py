"""Who takes part and where: the rendezvous through torch.distributed's store, its set-up
epochs, which ranks share a host, and the cores each rank of a host keeps to."""

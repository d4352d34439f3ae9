"""ringcomm as a torch.distributed backend: ``dist.init_process_group("ringcomm")`` (the
process group, its point-to-point, Works and tensor helpers)."""

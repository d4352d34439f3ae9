"""How bytes move between ranks: the backends by device (backends.py: "shm+tcp" for CPU
buffers, "nccl" for CUDA buffers), the shared-memory ring and links, TCP links, link kinds in
order of preference (links.py) and rings across hosts."""

"""The process around a run: fork and exit hooks (``hooks``), the run folder's lock against two
processes writing one folder (``run_lock``), and where the process sits in a distributed job
(``distributed``: rank, world size, node, from torch.distributed, Ray Train or the
launcher). May import ``settings``.
"""

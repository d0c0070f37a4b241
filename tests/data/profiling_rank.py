"""One rank of tests/test_aggregate.py's two-process run: gloo, sleep-timed blocks, one session report per rank.

    python -m torch.distributed.run --nproc-per-node 2 --master-port PORT tests/data/profiling_rank.py OUT SLOW_RANK
"""
import sys
import time

import torch
import torch.distributed as dist

from wmbook.profiling.session import ProfilingSession

out, slow_rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
block_s = 0.03 * (3 if rank == slow_rank else 1)  # the slow rank takes 3x as long per block
cfg = {"cpu_monitor_interval": 0.05, "report_format": "json", "output_dir": out, "real_time_display": False}
with ProfilingSession("dist_test", config=cfg, device="cpu", tags={"test": "aggregate"}) as s:
    with s.generation():
        for i in range(4):
            with s.block(i, frames=1 if i == 0 else 4):
                time.sleep(block_s)
    s.event("blocks_done", rank=rank)
t = torch.ones(1)
dist.all_reduce(t)  # after the session: a collective inside it would make the fast rank wait for the slow one
assert float(t) == dist.get_world_size()
dist.barrier()
dist.destroy_process_group()

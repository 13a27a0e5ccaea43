"""Worker: dist.Pace with uneven ranks (rank 1 takes 10 ms per hundredth of its work, rank 0
none; WORK "none" on rank 1: it has no rows at all). Prints each rank's meetings and waits."""
import json
import sys
import time

from sample_fc import dist

dist.init()
rank, work = dist.rank(), sys.argv[1]
waits, original_barrier = [], dist.barrier


def timed_barrier(name):
    started = time.perf_counter()
    original_barrier(name)
    waits.append(time.perf_counter() - started)


dist.barrier = timed_barrier
total = 0 if (work == "none" and rank == 1) else 1000
said = []
pace = dist.Pace("uneven work", total, say=said.append, say_after_s=0.0)
for _ in range(total // 10):
    if rank == 1:
        time.sleep(0.01)
    pace(10)
pace.finish()
print("PACE " + json.dumps({"rank": rank, "meetings": len(waits), "longest_wait_s": max(waits),
                            "total_wait_s": sum(waits), "said": said}), flush=True)

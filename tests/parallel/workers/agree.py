"""Worker: dist.agree with rank 1's work failing (a ValueError it was told of), then both
succeeding; prints each rank's outcomes."""
import json

from sample_fc import dist

dist.init()
rank = dist.rank()


def work():
    if rank == 1:
        raise ValueError("disk full")
    return {"rank": rank}


failed = dist.agree(work, "agree.failing", (ValueError, OSError), lambda error: f"rank {rank}: {error}",
                    share_results=True)
passed = dist.agree(lambda: rank * 10, "agree.passing", ValueError)
print("AGREE " + json.dumps({"rank": rank, "failed": failed, "passed": passed}), flush=True)

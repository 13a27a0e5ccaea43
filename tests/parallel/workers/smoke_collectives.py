"""Worker: allreduce, allgather and broadcast of MXNet NDArrays; prints one line per rank."""
import horovod.mxnet as hvd
import mxnet as mx
import numpy as np

hvd.init()
rank, size = hvd.rank(), hvd.size()

summed = hvd.allreduce(mx.nd.array([rank + 1.0, 10.0 * rank]), average=False, name="smoke.sum")
expected_sum = np.array([sum(r + 1.0 for r in range(size)), sum(10.0 * r for r in range(size))])
assert np.allclose(summed.asnumpy(), expected_sum), (summed, expected_sum)

# ranks contribute different row counts: r+1 rows filled with r
gathered = hvd.allgather(mx.nd.full((rank + 1, 3), rank), name="smoke.gather")
expected_rows = np.concatenate([np.full((r + 1, 3), r) for r in range(size)])
assert np.array_equal(gathered.asnumpy(), expected_rows), gathered

value = mx.nd.array([42.0, 7.0]) if rank == 0 else mx.nd.zeros(2)
broadcast = hvd.broadcast(value, root_rank=0, name="smoke.bcast")
assert np.array_equal(broadcast.asnumpy(), [42.0, 7.0]), broadcast

print(f"SMOKE_OK rank={rank} size={size}", flush=True)

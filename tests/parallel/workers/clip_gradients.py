"""Worker: BackboneOptimizer.sum_gradients on 2+ ranks with different gradients.

argv: clip_grad_norm. Each rank's gradients differ; after sum_gradients and one update of a
plain SGD (lr 1, no momentum, no decay) every rank must hold weight - clip(sum over ranks),
clip(g) = g * min(1, clip / ||g||) over all parameters together, computed here in NumPy.
"""
import sys

import horovod.mxnet as hvd
import mxnet as mx
import numpy as np

from sample_fc.optimizers import BackboneOptimizer

hvd.init()
rank, size = hvd.rank(), hvd.size()
clip = float(sys.argv[1])
shapes = [(3, 4), (5,), (2, 1, 3, 3)]
per_rank = [[np.random.default_rng((r, i)).standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)]
            for r in range(size)]
summed = [sum(per_rank[r][i] for r in range(size)) for i in range(len(shapes))]
norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in summed))
scale = min(1.0, clip / norm) if clip else 1.0

opt = BackboneOptimizer(mx.optimizer.SGD(learning_rate=1.0, momentum=0.0, wd=0.0, rescale_grad=1.0),
                           clip_grad_norm=clip)
weights = [mx.nd.ones(s) for s in shapes]
grads = [[mx.nd.array(g)] for g in per_rank[rank]]
returned = opt.sum_gradients(grads, 1)
for i, weight in enumerate(weights):
    opt.update(i, weight, grads[i][0], opt.create_state(i, weight))
for i, weight in enumerate(weights):
    np.testing.assert_allclose(weight.asnumpy(), 1.0 - scale * summed[i], rtol=1e-5, atol=1e-6)
assert abs(returned - norm) < 1e-4 * norm, (returned, norm)
print(f"CLIP_OK rank={rank} norm={norm:.4f} scale={scale:.4f}", flush=True)

"""Worker: a few Partial FC steps of a tiny linear backbone on a fixed global batch.

Runs alone (world size 1) or under horovodrun; rank r takes rows [r*b, (r+1)*b) of each
global batch. Writes OUT.rank<r>.npz with the losses, the sampled global class ids of
every step, the backbone parameters and this rank's bank (weight, momentum) afterwards.
"""
import argparse

import mxnet as mx
import numpy as np

from sample_fc import dist
from sample_fc.module import SampleDistributeModule
from sample_fc.optimizers import BackboneOptimizer, WarmupMultiStepSchedule
from sample_fc.pfc.partial_fc import PartialFC, PartialFCOptions

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--global-batch", type=int, default=8)
parser.add_argument("--classes", type=int, default=11)
parser.add_argument("--embedding", type=int, default=6)
parser.add_argument("--ratio", type=float, default=1.0)
parser.add_argument("--steps", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--allgather", default="native")
parser.add_argument("--contexts", type=int, default=1)
parser.add_argument("--head-kernel", default="auto", choices=("auto", "host", "device"))
parser.add_argument("--nan-step", type=int, default=-1, help="put a NaN into this step's data ...")
parser.add_argument("--nan-rank", type=int, default=0, help="... of this rank")
parser.add_argument("--nan-in", default="data", choices=("data", "gradient"),
                    help="gradient: the NaN goes into one backbone gradient after the backward instead "
                         "(the loss and d loss / d embeddings stay finite)")
parser.add_argument("--max-nonfinite", type=int, default=5)
parser.add_argument("--drop-step", type=int, default=-1, help="train on every step's batch but this one's")
parser.add_argument("--sample-correction", action="store_true", help="the sampled-softmax logit correction")
parser.add_argument("--sample-wd-correction", action="store_true", help="the bank's weight-decay correction")
parser.add_argument("--tail-bn", default="none", choices=("none", "worker", "global"),
                    help="none: the linear backbone; worker/global: FC -> BatchNorm -> FC -> BatchNorm, the "
                         "BatchNorms over each rank's batch or (global_tail.py) over the global batch")
parser.add_argument("--margin", default="combined", choices=("combined", "curricularface"))
args = parser.parse_args()

dist.init()
rank, world = dist.rank(), dist.size()
b = args.global_batch // world
data_shape = (3, 4, 4)
spec = np.random.default_rng(123)               # the test regenerates the same values
init_weight = spec.standard_normal((args.embedding, int(np.prod(data_shape)))) * 0.3
data = spec.standard_normal((args.steps, args.global_batch) + data_shape)
labels = spec.integers(0, args.classes, size=(args.steps, args.global_batch))

embeddings = mx.sym.FullyConnected(mx.sym.Flatten(mx.sym.var("data")), num_hidden=args.embedding,
                                   name="fc_embed")
init_params = {"fc_embed_weight": mx.nd.array(init_weight), "fc_embed_bias": mx.nd.zeros(args.embedding)}
init_aux, tail = {}, None
if args.tail_bn != "none":             # two layers, each followed by a BatchNorm over samples only
    hidden = mx.sym.BatchNorm(embeddings, name="hidden_bn", eps=1e-5, momentum=0.9)
    embeddings = mx.sym.BatchNorm(mx.sym.FullyConnected(hidden, num_hidden=args.embedding, name="fc_out"),
                                  name="embeddings", fix_gamma=True, eps=1e-5, momentum=0.9)
    init_params.update({"fc_out_weight": mx.nd.array(spec.standard_normal((args.embedding, args.embedding)) * 0.4),
                        "fc_out_bias": mx.nd.zeros(args.embedding)})
    for name in ("hidden_bn", "embeddings"):
        init_params.update({f"{name}_gamma": mx.nd.ones(args.embedding), f"{name}_beta": mx.nd.zeros(args.embedding)})
        init_aux.update({f"{name}_moving_mean": mx.nd.zeros(args.embedding),
                         f"{name}_moving_var": mx.nd.ones(args.embedding)})
    if args.tail_bn == "global":
        from sample_fc.pfc.global_tail import GlobalTail, split_tail
        embeddings, tail_symbol, cut_shape, _ = split_tail(embeddings, (b,) + data_shape)
        tail = GlobalTail(tail_symbol, cut_shape, args.global_batch, mx.cpu())
schedule = WarmupMultiStepSchedule(args.lr, warmup_steps=0, steps=[2], factor=0.5)
backbone_opt = BackboneOptimizer(mx.optimizer.SGD(learning_rate=args.lr, momentum=0.9, wd=5e-4,
                                                     rescale_grad=1.0, lr_scheduler=schedule))
options = PartialFCOptions(sample_ratio=args.ratio, sample_correction=args.sample_correction,
                           sample_wd_correction=args.sample_wd_correction, loss_s=8.0, head_kernel=args.head_kernel,
                           loss_margin=args.margin,
                           seed=7)                        # margin (1, 0.5, 0), the bank's SGD (0.9, 5e-4)
partial_fc = PartialFC.for_rank(args.classes, rank, world, args.embedding, mx.cpu(), options, schedule)
bank, sampler = partial_fc.bank, partial_fc.sampler
contexts = [mx.cpu(i) for i in range(args.contexts)]
module = SampleDistributeModule(embeddings, partial_fc, backbone_opt, context=contexts, batch_size=b,
                                data_shape=data_shape, allgather=args.allgather,
                                max_nonfinite_steps=args.max_nonfinite, tail=tail)
module.init_params(arg_params=init_params, aux_params=init_aux)
module.broadcast_parameters()



def backbone_params(module):
    """{name: NumPy array} of the backbone's arg and aux params."""
    arg_params, aux_params = module.get_export_params()
    return {k: v.asnumpy() for k, v in {**arg_params, **aux_params}.items()}


losses, sampled, grad_norms = [], [], []


def recording_sampler(all_labels, num_update=None):
    sample = sampler(all_labels, num_update)
    sampled.append(sample.index + bank.class_start)
    return sample


def poisoning_backward(out_grads):
    backward(out_grads=out_grads)
    if step == args.nan_step and rank == args.nan_rank:      # the loop's step below
        module.backbone._exec_group.grad_arrays[0][0][0, 0] = np.nan


partial_fc.sampler = recording_sampler
backward = module.backbone.backward
if args.nan_in == "gradient":
    module.backbone.backward = poisoning_backward
for step in range(args.steps):
    if step == args.drop_step:
        continue
    rows = slice(rank * b, (rank + 1) * b)
    rank_data = data[step, rows].copy()
    if step == args.nan_step and rank == args.nan_rank and args.nan_in == "data":
        rank_data[0, 0, 0, 0] = np.nan
    batch = mx.io.DataBatch(data=[mx.nd.array(rank_data)],
                            label=[mx.nd.array(labels[step, rows], dtype="int64")])
    loss, skipped = module.step(batch)
    losses.append(np.nan if skipped else loss)
    grad_norms.append(np.nan if skipped else module.last_grad_norm)

np.savez(f"{args.out}.rank{rank}.npz", losses=np.array(losses), grad_norms=np.array(grad_norms),
         class_start=bank.class_start,
         bank_weight=bank.weight.asnumpy(), bank_momentum=bank.momentum.asnumpy(),
         sampled=np.array(sampled, dtype=object), **backbone_params(module))
print(f"STEPS_OK rank={rank}", flush=True)

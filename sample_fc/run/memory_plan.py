"""The memory plan of a run: what one worker needs, computed before anything is allocated.

Everything that grows with the class count is here, per worker, for the largest shard
(C_r = ceil(C / W)), D the embedding size, B the global batch, K the rows scored per step
(K = min(C_r, max(ceil(ratio * C_r), B)): the sample, which grows to every positive):
    bank        C_r * (D * bank itemsize + momentum)        weights + momentum as stored, a row's:
                                                            D * itemsize (bank_momentum=same),
                                                            D + 4 ceil(D / 64) (int8), 0 (none)
    sampler     9 * C_r + 8 K                               a bool mask and an int64 index; the
                                                            corrections' float32 logit offsets
                                                            and weight-decay scales
    head        host kernel: 4 (K D + 2 B K + 3 B D + 3 threads 512 D)   rows, cosine, gradient
                            (no K D when K = C_r on a one-block float32 shard: the bank is used)
                device kernel: 4 (6 K D + 8 B K)            rows, momentum, gradients; B x K terms
    backbone    4 (3 P + 2 b A)                             P parameters (weight, gradient,
                                                            momentum), A activations per image
    runtime     RUNTIME_BYTES                               MXNet, Horovod, Python
and, for the user, the checkpoint's size and what a step moves between workers. The parts say
their own bytes (PartialFC.memory_bytes: MemoryBank, ClassCenterSampler and the head kernel's
workspace_bytes); `plan` adds them up, pure arithmetic (tests check it by hand); `available_bytes` reads what this machine has;
train.py refuses a run whose plan does not fit (`check_fits`) before allocating anything,
and `python -m sample_fc.tools.plan` prints it for any world.
"""
from dataclasses import dataclass

from symbols.cost import backbone_cost

from ..checkpoint.layout import checkpoint_bytes
from ..errors import UsageError
from ..pfc.partial_fc import PartialFC

GB = 1e9
RUNTIME_BYTES = int(0.6 * GB)       # one worker's MXNet + Horovod + Python, with room above what was measured


@dataclass
class Plan:
    """Bytes one worker needs (the largest shard's), and what a step moves."""
    world: int
    num_local: int              # classes of the largest shard
    sampled: int                # rows scored per step (K)
    global_batch: int
    bank: int
    sampler: int
    head: int
    backbone: int
    runtime: int
    checkpoint: int             # one checkpoint, all workers
    allgather_per_step: int     # bytes each worker receives per step (embeddings + labels)

    @property
    def total(self):
        return self.bank + self.sampler + self.head + self.backbone + self.runtime

    def summary(self):
        """The plan in one line (train.py's log)."""
        return (f"{self.total / GB:.2f} GB per worker (bank {self.bank / GB:.2f}, sampler {self.sampler / GB:.2f}, "
                f"head {self.head / GB:.2f}, backbone {self.backbone / GB:.2f}, runtime {self.runtime / GB:.2f} GB); "
                f"{self.num_local:,} classes and {self.sampled:,} rows sampled per step per worker; "
                f"one checkpoint {self.checkpoint / GB:.2f} GB")

    def lines(self):
        """The plan as lines for a person."""
        rows = [("bank (weights + momentum)", self.bank), ("sampler", self.sampler),
                ("head step temporaries", self.head), ("backbone (estimate)", self.backbone),
                ("runtime", self.runtime), ("total per worker", self.total)]
        out = [f"{name:<28}{value / GB:10.2f} GB" for name, value in rows]
        out += [f"{'classes per worker':<28}{self.num_local:>13,}",
                f"{'rows sampled per step':<28}{self.sampled:>13,}",
                f"{'allgather per step':<28}{self.allgather_per_step / 1e6:10.2f} MB",
                f"{'one checkpoint':<28}{self.checkpoint / GB:10.2f} GB"]
        return out


def plan(num_classes, world, embedding_size, batch_size, sample_ratio, bank_itemsize=4,
         backbone_params=0, activations_per_image=0, host_kernel=True, threads=1, bank_momentum="same"):
    """The Plan of one worker of a run of `world` workers with `batch_size` images each, its
    bank's momentum stored as `bank_momentum` (same, int8, none)."""
    if world < 1 or num_classes < world:
        raise ValueError(f"need 1 <= world <= num_classes, got world={world}, num_classes={num_classes}")
    num_local = -(-num_classes // world)
    global_batch = batch_size * world
    layer = PartialFC.memory_bytes(num_local, global_batch, embedding_size, sample_ratio, bank_itemsize,
                                   host_kernel, threads, bank_momentum)
    return Plan(world=world, num_local=num_local, sampled=layer["sampled"], global_batch=global_batch,
                bank=layer["bank"], sampler=layer["sampler"], head=layer["head"],
                backbone=4 * (3 * backbone_params + 2 * batch_size * activations_per_image),
                runtime=RUNTIME_BYTES,
                checkpoint=checkpoint_bytes(backbone_params, num_classes, embedding_size, bank_itemsize,
                                            bank_momentum),
                allgather_per_step=global_batch * (4 * embedding_size + 8))


def backbone_sizes(symbol, image_size):
    """(parameters, activations per image) of a backbone symbol: the numbers its arguments
    and auxiliary states hold, and the outputs of all its layers (not its inputs) for one image
    (symbols.cost.backbone_cost)."""
    cost = backbone_cost(symbol, image_size)
    return cost.params + cost.aux, cost.activations


def meminfo_available():
    """MemAvailable of this machine in bytes (Linux), or None."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# what else shrinks a plan, after the ways out that ways_out prices
OTHER_WAYS = ("fewer workers per node, a smaller embedding_size or sample_ratio (or sample_ratio_warmup_start: "
              "the plan holds the warm-up's first, largest ratio)")


def ways_out(replan, part, share, world, batch_size, num_classes, bank_dtype, bank_on_gpu, bank_momentum="same",
             host_kernel=True):
    """The changes that bring one worker's plan within `share` bytes, each a phrase with the GB
    per worker it gives: more workers (-np doubled until it fits), bank_dtype=float16 (a float32
    bank), bank_momentum=int8 (a float16 bank with its momentum as the weights, run by the host
    kernel: `host_kernel`, the bank in host memory),
    bank_context=cpu (a bank on the GPU: part 1), a smaller batch_size (halved until it
    fits; named first, with the backbone's size, when the backbone is the largest term).
    replan(world=, batch_size=, bank_dtype=, bank_momentum=, bank_on_gpu=) -> (host Plan, GPU Plan
    or None) with those changed; part: 0 for host memory, 1 for GPU memory. train.py and tools.plan
    list these."""
    current = replan()[part]
    ways = []

    def gb(the_plan):
        return f"{the_plan.total / GB:.1f} GB per worker" + ("" if the_plan.total <= share else ", still over")

    tried = []              # (plan, workers) for -np doubled while it does not fit (the global
    workers = world         # batch grows with it, and the head's B x K terms: the least is kept)
    while (not tried or tried[-1][0].total > share) and 2 * workers <= num_classes and workers < 1024 * world:
        workers *= 2
        tried.append((replan(world=workers)[part], workers))
    if tried:
        fewer, workers = tried[-1] if tried[-1][0].total <= share else min(tried, key=lambda t: (t[0].total, t[1]))
        if fewer.total < current.total:
            ways.append(f"more workers: -np {workers} ({gb(fewer)})")
    if bank_dtype == "float32":
        ways.append(f"bank_dtype=float16, half the bank ({gb(replan(bank_dtype='float16')[part])})")
    if bank_dtype == "float16" and bank_momentum == "same" and host_kernel and not bank_on_gpu:
        ways.append(f"bank_momentum=int8, 8-bit momentum ({gb(replan(bank_momentum='int8')[part])})")
    if part == 1 and bank_on_gpu:
        host, device = replan(bank_on_gpu=False)
        ways.append(f"the bank on the host, bank_context=cpu (GPU memory {gb(device)}; host memory "
                    f"then holds {host.total / GB:.1f} GB per worker)")
    batch, smaller = batch_size, current
    while smaller.total > share and batch > 1:
        batch //= 2
        smaller = replan(batch_size=batch)[part]
    if batch < batch_size:
        way = f"a smaller batch: batch_size={batch} ({gb(smaller)})"
        if current.backbone > max(current.bank, current.sampler, current.head):
            ways.insert(0, way + f" — the backbone, {current.backbone / GB:.1f} GB at batch {batch_size}, "
                                 f"is the largest term")
        else:
            ways.append(way)
    return ways


def check_fits(the_plan, available, local_workers, where="host memory", ways=lambda share: []):
    """UsageError naming the bytes needed and available, and the ways out (ways(share): ways_out's
    phrases, computed only then), when a worker's plan exceeds its share of `available` bytes
    (shared by `local_workers` workers)."""
    if available is None:
        return
    share = available / local_workers
    if the_plan.total <= share:
        return
    raise UsageError(
        f"this run needs {the_plan.total / GB:.1f} GB of {where} per worker (bank {the_plan.bank / GB:.1f} GB "
        f"for {the_plan.num_local:,} classes, step {the_plan.head / GB:.1f} GB, backbone {the_plan.backbone / GB:.1f} GB) "
        f"and {share / GB:.1f} GB are available ({available / GB:.1f} GB shared by {local_workers} "
        f"worker(s) on this node); ways out: {'; '.join(list(ways(share)) + [OTHER_WAYS])}; "
        f"see `python -m sample_fc.tools.plan`")

"""The memory plan of a run: what one worker needs, computed before anything is allocated.

Everything that grows with the class count is here, per worker, for the largest shard
(C_r = ceil(C / W)), D the embedding size, B the global batch, b a worker's, K the rows scored per
step (K = min(C_r, max(ceil(ratio * C_r), B)): the sample, which grows to every positive):
    bank        C_r * (D * bank itemsize + momentum)        weights + momentum as stored, a row's:
                                                            D * itemsize (bank_momentum=same),
                                                            D + 4 ceil(D / 64) (int8), 0 (none)
    sampler     9 * C_r + 8 K                               a bool mask and an int64 index; the
                                                            corrections' offsets and decay scales
    head        host kernel: 4 (K D + 2 B K + 3 B D + 3 threads 512 D)   rows, cosine, gradient
                            (no K D when K = C_r on a one-block float32 shard: the bank is used)
                device kernel: 4 (6 K D + 8 B K)            rows, momentum, gradients; B x K terms
    backbone    from MXNet itself (backbone_memory.py): its plan of the bound training graph at
                batch b, oneDNN's arrays outside it (a measured share), the parameters' copies,
                and the inference graph a verification binds
    data        BATCHES_IN_FLIGHT float32 batches of the loader, the verification sets' images
    runtime     RUNTIME_BYTES                               Python, MXNet, Horovod (measured)
and, for the user, the checkpoint's size and what a step moves between workers. The parts say
their own bytes (PartialFC.memory_bytes, backbone_memory); `plan` adds them up, pure arithmetic.
`run_plan` makes the plan of a config (its host and GPU parts); `check_memory` refuses a run whose
plan does not fit this node, in one line with the ways out (`ways_out`, each priced by replanning),
before anything is allocated. `python -m sample_fc.tools.plan` prints it for any world, and
`python -m bench.memory` measures it against real runs (docs/scale-and-memory.md).
"""
import dataclasses
import resource
from dataclasses import dataclass


from ..checkpoint.layout import checkpoint_bytes
from ..errors import UsageError
from ..options import OPTIMIZER_STATES
from ..pfc.head import default_threads
from ..pfc.partial_fc import PartialFC, PartialFCOptions, uses_host_kernel
from ..pfc.row_storage import Storage
from .backbone_memory import backbone_memory

GB = 1e9
RUNTIME_BYTES = int(0.26 * GB)      # one worker's Python, MXNet, Horovod and threads before its arrays (measured)
BATCHES_IN_FLIGHT = 4               # the loader's prefetched batches, the one in the step, the one decoding


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
    data: int                   # the loader's batches and the verification sets' images
    runtime: int
    checkpoint: int             # one checkpoint, all workers
    allgather_per_step: int     # bytes each worker receives per step (embeddings + labels)
    host_gpu_per_step: int = 0  # bytes crossing between a worker's GPU and host memory per step (a bank on the host)
    bank_row_bytes: int = 0     # bytes of one identity in the bank (row_storage.Storage.row_bytes)
    bank_holds: str = "weights + momentum"   # what a row holds, in words

    @property
    def total(self):
        return self.bank + self.sampler + self.head + self.backbone + self.data + self.runtime

    def summary(self):
        """The plan in one line (train.py's log)."""
        return (f"{self.total / GB:.2f} GB per worker (bank {self.bank / GB:.2f}, sampler {self.sampler / GB:.2f}, "
                f"head {self.head / GB:.2f}, backbone {self.backbone / GB:.2f}, data {self.data / GB:.2f}, "
                f"runtime {self.runtime / GB:.2f} GB); "
                f"{self.num_local:,} classes and {self.sampled:,} rows sampled per step per worker; "
                f"one checkpoint {self.checkpoint / GB:.2f} GB")

    def lines(self):
        """The plan as lines for a person."""
        rows = [(f"bank ({self.bank_holds})", self.bank), ("sampler", self.sampler),
                ("head step temporaries", self.head), ("backbone (MXNet's plan)", self.backbone),
                ("data (batches, val sets)", self.data),
                ("runtime", self.runtime), ("total per worker", self.total)]
        out = [f"{name:<28}{value / GB:10.2f} GB" for name, value in rows]
        out += [f"{'classes per worker':<28}{self.num_local:>13,}",
                f"{'bytes per identity':<28}{self.bank_row_bytes:>13,}",
                f"{'rows sampled per step':<28}{self.sampled:>13,}",
                f"{'allgather per step':<28}{self.allgather_per_step / 1e6:10.2f} MB"]
        if self.host_gpu_per_step:
            out.append(f"{'GPU <-> host per step':<28}{self.host_gpu_per_step / 1e6:10.2f} MB")
        out.append(f"{'one checkpoint':<28}{self.checkpoint / GB:10.2f} GB")
        return out


def plan(num_classes, world, embedding_size, batch_size, sample_ratio, storage=Storage(), backbone_bytes=0,
         backbone_params=0, data_bytes=0, host_kernel=True, threads=1):
    """The Plan of one worker of a run of `world` workers with `batch_size` images each, its
    bank stored as `storage` (row_storage.Storage); the backbone's and the data's
    bytes given (backbone_memory's total), the backbone's parameter count for the checkpoint."""
    if world < 1 or num_classes < world:
        raise ValueError(f"need 1 <= world <= num_classes, got world={world}, num_classes={num_classes}")
    num_local = -(-num_classes // world)
    global_batch = batch_size * world
    layer = PartialFC.memory_bytes(num_local, global_batch, embedding_size, sample_ratio, storage,
                                   host_kernel, threads)
    return Plan(world=world, num_local=num_local, sampled=layer["sampled"], global_batch=global_batch,
                bank=layer["bank"], sampler=layer["sampler"], head=layer["head"], backbone=backbone_bytes,
                data=data_bytes, runtime=RUNTIME_BYTES,
                checkpoint=checkpoint_bytes(backbone_params, num_classes, embedding_size, storage),
                allgather_per_step=global_batch * (4 * embedding_size + 8),
                bank_row_bytes=storage.row_bytes(embedding_size),
                bank_holds="weights, no momentum" if storage.momentum == "none" else "weights + momentum")


def runs_host_kernel(cfg, bank_on_gpu):
    """Whether config `cfg`'s head runs on the host kernel, its bank on a GPU or not
    (partial_fc.uses_host_kernel: UsageError for a bank the chosen kernel cannot run)."""
    return uses_host_kernel(cfg.head_kernel, "gpu" if bank_on_gpu else "cpu", Storage.of(cfg))


def run_plan(cfg, world, symbol, on_gpu, bank_on_gpu, threads, target_bytes=0):
    """(host memory plan, GPU memory plan or None) of one worker of a run of config `cfg`: on a
    CPU run everything is in host memory; on GPUs the backbone is on the GPU, and the bank, the
    sampler's and the head's memory where the bank is. `target_bytes`: the verification sets'
    images (a run with none does not verify). UsageError for a bank the chosen kernel cannot run
    (partial_fc.uses_host_kernel)."""
    host_kernel = runs_host_kernel(cfg, on_gpu and bank_on_gpu)
    backbone = backbone_memory(symbol, cfg.network, cfg.image_size, cfg.batch_size, on_cpu=not on_gpu,
                               verifies=target_bytes > 0, optimizer_states=OPTIMIZER_STATES[cfg.optimizer])
    loader = BATCHES_IN_FLIGHT * cfg.batch_size * 3 * cfg.image_size ** 2 * 4
    peak_ratio = PartialFCOptions.from_config(cfg).peak_ratio()      # the warm-up's start, if larger
    whole = plan(cfg.num_classes, world, cfg.embedding_size, cfg.batch_size, peak_ratio,
                 Storage.of(cfg), backbone.total, backbone.values, loader + target_bytes, host_kernel, threads)
    if not on_gpu:
        return whole, None
    if bank_on_gpu:
        return (dataclasses.replace(whole, bank=0, sampler=0, head=0, backbone=0),
                dataclasses.replace(whole, data=0, runtime=0))
    # the bank on the host: the worker's embeddings go down to the head, their gradient comes back
    crossing = 2 * cfg.batch_size * cfg.embedding_size * 4
    return (dataclasses.replace(whole, backbone=0, host_gpu_per_step=crossing),
            dataclasses.replace(whole, bank=0, sampler=0, head=0, data=0, runtime=0, host_gpu_per_step=crossing))


def plan_ways_out(cfg, world, symbol, on_gpu, bank_on_gpu, threads, part, target_bytes=0):
    """ways(share): ways_out's priced changes for this run's host (part 0) or GPU (part 1) plan,
    replanned by run_plan with the changed keys."""
    def replan(world=world, bank_on_gpu=bank_on_gpu, **changes):
        return run_plan(type(cfg)(dict(cfg, **changes)), world, symbol, on_gpu, bank_on_gpu, threads, target_bytes)
    gpu_bank = on_gpu and bank_on_gpu
    options = PartialFCOptions.from_config(cfg)
    return lambda share: ways_out(replan, part, share, world, cfg.batch_size, cfg.num_classes, Storage.of(cfg),
                                  gpu_bank, runs_host_kernel(cfg, gpu_bank),
                                  (options.sample_ratio, options.peak_ratio()))


def check_memory(cfg, world, symbol, ctx, bank_ctx, local_size, target_bytes=0, gpu_free_bytes=None):
    """(host plan, GPU plan or None) of this worker; UsageError when it does not fit what its node
    has: host memory (MemAvailable, shared by the node's workers), and on GPUs its device's free
    memory (`gpu_free_bytes(device_id)`); the error lists the ways out with what each would give."""
    on_gpu, bank_on_gpu, threads = ctx.device_type == "gpu", bank_ctx.device_type == "gpu", default_threads(local_size)
    host, device = run_plan(cfg, world, symbol, on_gpu, bank_on_gpu, threads, target_bytes)
    check_fits(host, meminfo_available(), local_size, "host memory",
               plan_ways_out(cfg, world, symbol, on_gpu, bank_on_gpu, threads, 0, target_bytes))
    if device is not None:
        check_fits(device, gpu_free_bytes(ctx.device_id), 1, f"GPU {ctx.device_id} memory",
                   plan_ways_out(cfg, world, symbol, on_gpu, bank_on_gpu, threads, 1, target_bytes))
    return host, device


def _proc_bytes(path, key):
    """The `key:` line of a /proc file (in kB) in bytes, or None where it cannot be read."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes():
    """The peak resident memory of this process so far, in bytes: VmHWM of /proc/self/status (Linux).
    Not ru_maxrss, which a process started by vfork (Python's subprocess) inherits from its parent:
    a child of a 2 GB process reports 2 GB there whatever it uses itself."""
    peak = _proc_bytes("/proc/self/status", "VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def meminfo_available():
    """MemAvailable of this machine in bytes (Linux), or None."""
    return _proc_bytes("/proc/meminfo", "MemAvailable")


# what else shrinks a plan, after the ways out that ways_out prices
OTHER_WAYS = "fewer workers per node, a smaller embedding_size or sample_ratio"


def ways_out(replan, part, share, world, batch_size, num_classes, storage, bank_on_gpu, host_kernel=True,
             ratios=None):
    """The changes that bring one worker's plan within `share` bytes, each a phrase with the GB
    per worker it gives: more workers (-np doubled until it fits), bank_dtype=float16 (a float32
    bank), bank_momentum=none (momentum stored as the weights; either kernel), bank_momentum=int8 (a
    float16 bank with its momentum as the weights) and 8-bit centers (bank_dtype=int8,
    bank_momentum=none: a float bank), both run by the host kernel (`host_kernel`,
    the bank in host memory); the sampling warm-up started at the ratio itself (`ratios`: (the
    sample ratio, the plan's peak ratio), when the warm-up's start is larger),
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
        if fewer.total <= share or fewer.total < 0.9 * current.total:     # a way that fits, or saves a tenth
            ways.append(f"more workers: -np {workers} ({gb(fewer)})")
    if storage.weights == "float32":
        ways.append(f"bank_dtype=float16, half the bank ({gb(replan(bank_dtype='float16')[part])})")
    if storage.momentum == "same":
        ways.append(f"bank_momentum=none, no momentum for the centers ({gb(replan(bank_momentum='none')[part])})")
    if storage == Storage("float16", "same") and host_kernel and not bank_on_gpu:
        ways.append(f"bank_momentum=int8, 8-bit momentum ({gb(replan(bank_momentum='int8')[part])})")
    if storage.weights != "int8" and host_kernel and not bank_on_gpu:
        eight_bit = replan(bank_dtype="int8", bank_momentum="none")[part]
        ways.append(f"bank_dtype=int8 with bank_momentum=none, 8-bit centers ({gb(eight_bit)})")
    if ratios is not None and ratios[1] > ratios[0] and current.head > 0:
        start = replan(sample_ratio_warmup_start=ratios[0])[part]
        ways.append(f"no sampling warm-up: sample_ratio_warmup_start={ratios[0]:g} (the plan holds the warm-up's "
                    f"first ratio, {ratios[1]:g}; {gb(start)})")
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
        f"for {the_plan.num_local:,} classes, step {the_plan.head / GB:.1f} GB, "
        f"backbone {the_plan.backbone / GB:.1f} GB) "
        f"and {share / GB:.1f} GB are available ({available / GB:.1f} GB shared by {local_workers} "
        f"worker(s) on this node); ways out: {'; '.join(list(ways(share)) + [OTHER_WAYS])}; "
        f"see `python -m sample_fc.tools.plan`")

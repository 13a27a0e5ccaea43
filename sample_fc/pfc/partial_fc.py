"""PartialFC: this rank's Partial FC layer (steps 3-8 and 10 of docs/DESIGN.md, "One step").

It owns everything of the classifier that is model-parallel: the bank (this rank's shard of
class centers and their momentum), the sampler and its policy (ratio warm-up, the log(1/q)
logit correction, the wd/q decay correction), the margin and its warm-up, the kernel that runs
the head (host: NumPy BLAS; device: MXNet operators), the bank's optimizer (made here from the
run's lr schedule) and what all of that costs in memory. The sampler hands the kernel one
sampler.Sample; a new sampling option is a field of Sample and its use in the kernels.

    pfc = PartialFC.for_rank(num_classes, rank, world, embedding_size, ctx, options, lr_schedule)
    loss, grad_embeddings = pfc.forward_backward(all_embeddings, all_labels, num_update)
    pfc.update(num_update)          # or pfc.discard() for a skipped step
"""
import dataclasses
from dataclasses import dataclass


from .. import dist
from .device_head import DeviceHead
from .head import HostHead, default_threads, no_stage
from .margin import MarginWarmup, make_margin
from .memory_bank import MAX_BLOCK_ELEMENTS, MemoryBank
from .row_storage import Storage
from .bank_optimizer import MemoryBankSGDOptimizer
from ..config import bank_setting
from ..errors import UsageError
from ..options import HEAD_KERNELS
from .sampler import ClassCenterSampler, SampleRatioWarmup, most_rows_scored


@dataclass(frozen=True)
class PartialFCOptions:
    """What a Partial FC layer is, in the config's own key names (sample_fc/config/keys.py comments each);
    built once from the config (from_config) and saved with every checkpoint (state.json's
    "partial_fc"). The defaults are the library's, not the config's."""
    sample_ratio: float = 1.0               # the centers of a shard scored per step, after the warm-up
    sample_ratio_warmup_steps: int = 0      # updates over which the ratio falls from ..._start
    sample_ratio_warmup_start: float = 1.0
    sample_correction: bool = False         # + log(1/q) on each sampled negative's logit
    sample_wd_correction: bool = False      # each sampled negative decays with wd / q
    loss_margin: str = "combined"           # pfc/margin.py: combined | curricularface
    loss_m1: float = 1.0                    # margin cos(m1 theta + m2) - m3, scale s
    loss_m2: float = 0.5
    loss_m3: float = 0.0
    loss_s: float = 64.0
    margin_warmup_steps: int = 0            # updates over which the margins grow in from 0
    momentum: float = 0.9                   # the bank's SGD
    wd: float = 5e-4                        # the bank's (config: bank_wd, or wd)
    momentum_form: str = "mxnet"
    head_kernel: str = "auto"               # auto | host | device
    bank_dtype: str = "float32"
    bank_momentum: str = "same"             # the bank's momentum: same (as the weights) | int8 | none
    seed: int = 0                           # the bank's initial centers and the sampler's stream

    @classmethod
    def from_config(cls, cfg):
        """The options of a resolved config (every field is a config key; wd is the bank's:
        bank_wd, or wd where that is 'same')."""
        options = {field.name: cfg[field.name] for field in dataclasses.fields(cls)}
        return cls(**dict(options, wd=bank_setting(cfg, "wd")))

    def peak_ratio(self):
        """The largest sample ratio of the schedule (the warm-up's start, if larger): what the
        memory plan must hold."""
        return SampleRatioWarmup(self.sample_ratio, self.sample_ratio_warmup_steps,
                                 self.sample_ratio_warmup_start).peak()


def uses_host_kernel(kernel, bank_device_type, storage=Storage()):
    """Whether head_kernel `kernel` runs the head on the host (NumPy BLAS): `host`, or `auto` for
    a CPU bank. Raises UsageError for `host` with a bank on a GPU (the host kernel reads the
    bank's memory in place), and for a `storage` only the host kernel reads
    (Storage.device_readable) anywhere but there, so a run stops at its memory plan, before
    anything is allocated."""
    if kernel == "host" and bank_device_type != "cpu":
        raise UsageError(f"head_kernel=host runs the head on the bank's host memory, and this run's bank is "
                         f"on the {bank_device_type.upper()}: set bank_context=cpu, or head_kernel=auto")
    if not storage.device_readable and bank_device_type != "cpu":
        raise UsageError(f"{storage.describe()} needs the bank in host memory (the host kernel), and "
                         f"this run's bank is on the {bank_device_type.upper()}: set bank_context=cpu, or "
                         f"{storage.device_readable_instead()}")
    if not storage.device_readable and kernel == "device":
        raise UsageError(f"{storage.describe()} runs on the host kernel only, and this run has "
                         f"head_kernel=device: set head_kernel=auto, or {storage.device_readable_instead()}")
    return kernel == "host" or (kernel == "auto" and bank_device_type == "cpu")


def make_head(kernel, bank, bank_optimizer, collectives=dist, stage=no_stage, threads=None):
    """The head.Head of this rank: `host` (NumPy BLAS, float32/float16 CPU banks), `device` (MXNet
    operators on the bank's context), or `auto` = host where it applies. `collectives` has the
    softmax's allreduce_max and allreduce_sum (dist's); `threads` share the host kernel's update
    (None: the cores shared by this machine's ranks)."""
    if kernel not in HEAD_KERNELS:
        raise ValueError(f"head_kernel must be one of {HEAD_KERNELS}, got {kernel!r}")
    reduce = {"allreduce_max": collectives.allreduce_max, "allreduce_sum": collectives.allreduce_sum}
    if uses_host_kernel(kernel, bank.ctx.device_type, bank.storage):
        return HostHead(bank, bank_optimizer, stage=stage, threads=threads or default_threads(dist.local_size()),
                        **reduce)
    return DeviceHead(bank, bank_optimizer, stage=stage, **reduce)


class PartialFC:
    """This rank's Partial FC layer over its MemoryBank `bank`, as `options` (PartialFCOptions)
    say; its bank optimizer follows `lr_schedule` (update number -> lr, the backbone's).
    `collectives`: the softmax's allreduce_max / allreduce_sum (dist, the default). Every rank
    must build one with the same options: the softmax is a collective."""

    def __init__(self, bank, options, lr_schedule, collectives=dist, threads=None):
        self.bank, self.options = bank, options
        self.sampler = ClassCenterSampler.for_bank(
            bank, options.sample_ratio, seed=options.seed, warmup_steps=options.sample_ratio_warmup_steps,
            warmup_start=options.sample_ratio_warmup_start, logit_correction=options.sample_correction,
            decay_correction=options.sample_wd_correction)
        self.margin_schedule = MarginWarmup(make_margin(options.loss_margin, options.loss_m1, options.loss_m2,
                                                        options.loss_m3, options.loss_s),
                                            options.margin_warmup_steps)      # update number -> its margin
        self.optimizer = MemoryBankSGDOptimizer(lr_schedule, options.momentum, options.wd, options.momentum_form)
        self._stage_hook = no_stage
        self.head = make_head(options.head_kernel, bank, self.optimizer, collectives, self.stage, threads)

    @classmethod
    def for_rank(cls, num_classes, rank, world, embedding_size, ctx, options, lr_schedule, collectives=dist,
                 threads=None, initial_centers=True, progress=None):
        """The layer of `rank` of `world`: its balanced shard of `num_classes` centers on `ctx`
        (their initial values drawn, or zeros for a checkpoint to fill: MemoryBank)."""
        bank = MemoryBank.for_rank(num_classes, rank, world, embedding_size, ctx, seed=options.seed,
                                   storage=Storage.of(options), initial_centers=initial_centers, progress=progress,
                                   threads=threads or default_threads(dist.local_size()))
        return cls(bank, options, lr_schedule, collectives, threads)

    def state_dict(self):
        """The layer's state beside its bank's rows (which a checkpoint keeps as files of `bank`):
        this rank's sampler (its RNG) and the margin's (CurricularFace's running mean; the same
        on every rank). JSON-able."""
        return {"sampler": self.sampler.state_dict(), "margin": self.margin_schedule.target.state_dict()}

    def load_state_dict(self, state):
        """Continue from a state_dict's parts present in `state`: a resume on another split has
        no sampler of this rank's own to take (the margin's is every rank's), and a checkpoint
        from before the margin had a state holds none."""
        if "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        self.margin_schedule.target.load_state_dict(state.get("margin", {}))

    @property
    def ctx(self):
        """Where the bank, and so the head's work, lives."""
        return self.bank.ctx

    def connect(self, stage_hook):
        """`stage_hook(name)` -> a context manager, told of each stage of the layer's step (the
        module passes its own, so one hook sees the whole step)."""
        self._stage_hook = stage_hook

    def stage(self, name):
        """The stage hook's context for the block `name`."""
        return self._stage_hook(name)

    def forward_backward(self, embeddings, labels, num_update):
        """3-8 for update `num_update` (1-based): sample this shard for the global batch's integer
        `labels`, then the head (rows, cosine, margin, exact distributed softmax, gradients).
        Returns (global mean loss (1,) NDArray, d loss / d embeddings (B, D), this rank's part)."""
        with self.stage("sample"):
            sample = self.sampler(labels, num_update)
        return self.head.forward_backward(embeddings, sample, len(labels), self.margin_schedule(num_update))

    def update(self, num_update):
        """10. SGD-momentum on the sampled rows of the last forward_backward only."""
        self.head.update(num_update)

    def discard(self):
        """Forget the last forward_backward's update (a skipped step)."""
        self.head.discard()

    @staticmethod
    def memory_bytes(num_local, global_batch, embedding_size, sample_ratio, storage=Storage(), host_kernel=True,
                     threads=1):
        """{bank, sampler, head, sampled}: bytes of one rank's layer with `num_local` classes stored
        as `storage` (row_storage.Storage) at `sample_ratio`
        (the schedule's peak, options.peak_ratio), and the rows scored,
        K = min(C_r, max(ceil(ratio C_r), B)) (the sample grows to every positive). Pure
        arithmetic (memory_plan.plan adds the backbone's)."""
        sampled = most_rows_scored(num_local, sample_ratio, global_batch)
        if host_kernel:
            rows_are_bank = (sampled == num_local and storage.in_place
                             and num_local * embedding_size <= MAX_BLOCK_ELEMENTS)
            head = HostHead.workspace_bytes(sampled, global_batch, embedding_size, threads, rows_are_bank)
        else:
            head = DeviceHead.workspace_bytes(sampled, global_batch, embedding_size)
        return {"bank": MemoryBank.bytes_needed(num_local, embedding_size, storage),
                "sampler": ClassCenterSampler.bytes_needed(num_local, sampled), "head": head, "sampled": sampled}

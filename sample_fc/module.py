"""SampleDistributeModule: the Partial FC training step of one rank (docs/DESIGN.md, "One step")."""
import logging
import math
import time
import warnings
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from . import dist
from .head import DeviceHead, no_stage
from .host_head import HostHead, default_threads
from .initializers import backbone_initializer
from .margin import MarginWarmup
from .options import ALLGATHERS, HEAD_KERNELS
from .sampler import as_int_labels, sampled_decay_scales, sampled_logit_offsets


@dataclass
class StepInfo:
    """What a batch-end callback is told after each update."""
    step: int              # number of updates done, 1-based
    loss: float            # mean loss over the global batch (the same on every rank)
    lr: float
    global_batch: int
    seconds: float         # wall time of this step
    skipped: bool = False  # non-finite loss or gradients on some rank: nothing was updated
    grad_norm: float = math.nan  # global L2 norm of the backbone's summed gradients, before clipping


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with non-finite loss or gradients."""


class SampleDistributeModule:
    """A data-parallel backbone, this rank's shard of class centers, and an exact softmax
    over a sample of every rank's centers: one rank's part of a Partial FC run.

    `step(batch)` runs, in this order (rank r of W, b = batch_size, B = b * W):
      forward_backbone       1. the backbone on this rank's batch -> embeddings (b x D)
      loss_and_gradients     2. allgather the global batch: embeddings (B x D), integer labels
                             3. sampler: every local positive + uniform negatives -> index I
                             4-8. head (head.Head): rows I of the bank, cosine, this step's
                                margin, exact distributed softmax, loss and gradients
                             9. reducescatter d loss / d embeddings to this rank's b rows,
                                then the backbone's backward
      all_ranks_finite       skip the step everywhere when any rank saw NaN/Inf
      apply_updates          10. SGD-momentum on bank rows I only; 11. the backbone's update
                                (its optimizer sums the gradients over ranks)

    Collaborators: `symbol` (input `data`, one output: the embeddings), `bank` (this rank's
    MemoryBank), `sampler` (this rank's ClassCenterSampler), `margin` (the CombinedMargin to
    train with), `bank_optimizer` (MemoryBankSGDOptimizer), `backbone_optimizer` (a
    BackboneOptimizer), `context` (one mx.Context or a list: the backbone's devices).
    Options: `batch_size` per rank, `data_shape` of one sample, `allgather` strategy (dist.py),
    `head_kernel` (auto | host | device), `margin_warmup_steps` (margin.MarginWarmup: the module
    alone decides each step's margin, margin_at), `sample_correction` (add log(1/q) to each sampled
    negative's logit, q its chance to be drawn: sampler.sampled_logit_offsets), `sample_wd_correction`
    (decay each sampled negative's bank row with wd / q: sampler.sampled_decay_scales), `max_nonfinite_steps` in a row before
    NonFiniteError. `stage_hook(name)` -> context manager is told each stage of the step as it
    runs (the step watchdog; a benchmark's timer). Every rank must build the same module (same
    symbol and shapes): the steps are collectives.
    """

    def __init__(self, symbol, *, bank, sampler, margin, bank_optimizer, backbone_optimizer, context,
                 batch_size, data_shape=(3, 112, 112), allgather="native", head_kernel="auto",
                 margin_warmup_steps=0, sample_correction=False, sample_wd_correction=False,
                 max_nonfinite_steps=5, logger=None):
        if allgather not in ALLGATHERS:
            raise ValueError(f"allgather must be one of {ALLGATHERS}, got {allgather!r}")
        self.contexts = list(context) if isinstance(context, (list, tuple)) else [context]
        self.bank, self.sampler = bank, sampler
        self.margin_schedule = MarginWarmup(margin, margin_warmup_steps)   # update number -> margin
        self.bank_optimizer, self.backbone_optimizer = bank_optimizer, backbone_optimizer
        self.batch_size, self.allgather = batch_size, allgather
        self.sample_correction, self.sample_wd_correction = sample_correction, sample_wd_correction
        self.max_nonfinite_steps = max_nonfinite_steps
        self.logger = logger or logging.getLogger("sample_fc")
        self.num_update = 0
        self.nonfinite_in_a_row = self.nonfinite_total = 0
        self.last_grad_norm = math.nan    # of the last applied update (StepInfo.grad_norm)
        self.backbone = mx.mod.Module(symbol, data_names=("data",), label_names=None,
                                      context=self.contexts)
        self.backbone.bind(data_shapes=[("data", (batch_size,) + tuple(data_shape))], for_training=True)
        self.stage_hook = no_stage
        self.head = make_head(head_kernel, bank, bank_optimizer, self.stage)
        self._labels = None                 # this rank's integer labels of the current batch
        self._grad_all_embeddings = None    # this step's d loss / d (global embeddings), partial

    def stage(self, name):
        """The stage hook's context for the block `name` of the step."""
        return self.stage_hook(name)

    def margin_at(self, num_update):
        """The margin of update `num_update` (1-based): the target after the warm-up."""
        return self.margin_schedule(num_update)

    # ---- set-up -----------------------------------------------------------------------
    def init_params(self, initializer=None, arg_params=None, aux_params=None):
        """Initialise the backbone (default: initializers "pytorch"), then call
        broadcast_parameters so all ranks agree."""
        self.backbone.init_params(initializer=initializer or backbone_initializer("pytorch"),
                                  arg_params=arg_params, aux_params=aux_params, allow_missing=False)
        param_names = self.backbone._exec_group.param_names
        kvstore = "local" if len(self.contexts) > 1 else None
        if kvstore is None:
            self.backbone_optimizer.set_param_names(dict(enumerate(param_names)))
        else:                   # update on the local kvstore: one index per parameter and device
            self.backbone_optimizer.set_param_names(
                {i * len(self.contexts) + k: n for i, n in enumerate(param_names)
                 for k in range(len(self.contexts))})
        with warnings.catch_warnings():   # rescale_grad 1.0 is intended: the loss is a global mean
            warnings.filterwarnings("ignore", message=".*rescale_grad is not normalized.*")
            self.backbone.init_optimizer(kvstore=kvstore, optimizer=self.backbone_optimizer)

    def broadcast_parameters(self, root_rank=0):
        """Make every rank's backbone parameters equal root_rank's."""
        arg_params, aux_params = self.backbone.get_params()
        params = {f"arg:{k}": v for k, v in arg_params.items()}
        params.update({f"aux:{k}": v for k, v in aux_params.items()})
        dist.broadcast_parameters(params, root_rank=root_rank, prefix="backbone")
        self.backbone.set_params(arg_params, aux_params)

    def set_num_update(self, num_update):
        """Continue counting updates from `num_update` (resume): the lr schedule of both
        optimizers follows, since MXNet's optimizer starts its counts at begin_num_update."""
        self.num_update = num_update
        self.backbone_optimizer.set_num_update(num_update)

    def get_export_params(self):
        """(arg_params, aux_params) of the backbone for saving and evaluation.

        The aux params (BatchNorm moving statistics) are each rank's own during training;
        here they are averaged over ranks, so every rank evaluates and saves the same model.
        Averaging commutes with the moving-average updates, so resuming stays exact.
        Collective: every rank must call it.
        """
        arg_params, aux_params = self.backbone.get_params()
        averaged = {name: dist.allreduce_sum(aux_params[name], f"export.aux.{name}") / dist.size()
                    for name in sorted(aux_params)}
        return arg_params, averaged

    # ---- the parts of one step --------------------------------------------------------
    def forward_backbone(self, data_batch):
        """1. The backbone's forward on this rank's batch; keeps its integer labels."""
        self._labels = as_int_labels(data_batch.label[0])
        if self._labels.shape != (self.batch_size,):
            raise ValueError(f"expected {self.batch_size} labels per rank, got shape {self._labels.shape}")
        self.backbone.forward(data_batch, is_train=True)

    def loss_and_gradients(self):
        """2-9 after forward_backbone: returns the global mean loss ((1,) NDArray)."""
        stage, bank_ctx = self.stage, self.bank.ctx
        embeddings = self.backbone.get_outputs(merge_multi_context=True)[0]
        with stage("allgather"):      # 2. the global batch: embeddings (B x D), integer labels (B)
            all_embeddings = dist.allgather(embeddings.as_in_context(bank_ctx), "embeddings", self.allgather)
            all_labels = dist.allgather(mx.nd.array(self._labels, dtype="int64"), "labels").asnumpy()
        with stage("sample"):         # 3. this rank's centers: all local positives + uniform negatives
            target, index = self.sampler(all_labels, self.num_update + 1)
            offsets = (sampled_logit_offsets(target, len(index), self.bank.num_local)
                       if self.sample_correction else None)
            decay_scales = (sampled_decay_scales(target, len(index), self.bank.num_local)
                            if self.sample_wd_correction else None)
        # 4-8. sampled rows, cosine, margin, exact distributed softmax (corrected for the sample), gradients
        loss, self._grad_all_embeddings = self.head.forward_backward(
            all_embeddings, target, index, len(all_labels), self.margin_at(self.num_update + 1), offsets,
            decay_scales)
        with stage("reducescatter"):  # 9. this rank's rows of d loss / d embeddings, summed over ranks
            grad_embeddings = dist.reducescatter_sum(self._grad_all_embeddings, "embedding_grads")
        with stage("backbone_backward"):
            self.backbone.backward(out_grads=[grad_embeddings.as_in_context(self.contexts[0])])
        return loss

    def all_ranks_finite(self, loss):
        """True when the loss and every gradient of this step are finite on every rank.

        Checks the loss, this rank's d loss / d embeddings (it shares every factor of the
        bank-row gradients except the finite normalised rows) and the backbone gradients,
        the latter with one fused sum of squares (NaN and Inf propagate through it).
        """
        checks = [loss.reshape(-1), mx.nd.sum(self._grad_all_embeddings).reshape(-1)]
        grads_by_context = {}
        for per_parameter in self.backbone._exec_group.grad_arrays:
            for grad in per_parameter:
                grads_by_context.setdefault(grad.context, []).append(grad)
        for grads in grads_by_context.values():
            squares = mx.nd.multi_sum_sq(*grads, num_arrays=len(grads))
            checks.append(mx.nd.sum(squares).as_in_context(loss.context).reshape(-1))
        local_bad = 0.0 if np.isfinite(mx.nd.add_n(*checks).asscalar()) else 1.0
        return dist.allreduce_max(mx.nd.array([local_bad]), "step.nonfinite").asscalar() == 0.0

    def apply_updates(self):
        """10-11: SGD-momentum on the sampled bank rows; the backbone's gradients summed over
        the ranks (one fused collective) and clipped to the optimizer's global norm, then its update."""
        self.num_update += 1
        with self.stage("bank_update"):
            self.head.update(self.num_update)
        with self.stage("backbone_update"):
            self.last_grad_norm = self.backbone_optimizer.sum_gradients(self.backbone._exec_group.grad_arrays,
                                                                        self.num_update)
            self.backbone.update()

    # ---- one step ---------------------------------------------------------------------
    def step(self, data_batch):
        """One full training step; returns (global mean loss, skipped).

        A step whose loss or gradients are non-finite on any rank changes nothing on any
        rank (BatchNorm statistics included); after max_nonfinite_steps such steps in a
        row NonFiniteError is raised.
        """
        aux_before = [[a.copy() for a in per_context] for per_context in self.backbone._exec_group.aux_arrays]
        with self.stage("forward"):
            self.forward_backbone(data_batch)
        loss = self.loss_and_gradients()
        with self.stage("finite_check"):
            finite = self.all_ranks_finite(loss)
        if finite:
            self.apply_updates()
            self.nonfinite_in_a_row = 0
            return float(loss.asscalar()), False
        for saved, live in zip(aux_before, self.backbone._exec_group.aux_arrays):
            for source, target in zip(saved, live):
                source.copyto(target)
        self.head.discard()
        self.nonfinite_in_a_row += 1
        self.nonfinite_total += 1
        self.logger.warning("non-finite loss or gradients after update %d: step skipped "
                            "(%d in a row, %d in total)", self.num_update, self.nonfinite_in_a_row,
                            self.nonfinite_total)
        if self.nonfinite_in_a_row >= self.max_nonfinite_steps:
            raise NonFiniteError(f"{self.nonfinite_in_a_row} consecutive steps with non-finite loss or "
                                 f"gradients (max_nonfinite_steps={self.max_nonfinite_steps}); stopping "
                                 f"at update {self.num_update}, the last checkpoint is intact")
        return float(loss.asscalar()), True

    def fit(self, train_iter, max_update, batch_end_callbacks=()):
        """Train until `max_update` updates are done; the loop alone decides when to stop.

        The iterator is reset at the end of each epoch. Each callback gets a StepInfo.
        """
        global_batch = self.batch_size * dist.size()
        while self.num_update < max_update:
            try:
                with self.stage("data"):
                    batch = train_iter.next()
            except StopIteration:
                train_iter.reset()
                continue
            start = time.perf_counter()
            loss, skipped = self.step(batch)
            info = StepInfo(self.num_update, loss, self.bank_optimizer.lr_schedule(self.num_update),
                            global_batch, time.perf_counter() - start, skipped,
                            math.nan if skipped else self.last_grad_norm)
            for callback in batch_end_callbacks:
                callback(info)
        return self


def uses_host_kernel(kernel, bank_device_type, bank_dtype):
    """Whether head_kernel `kernel` runs the head on the host (NumPy BLAS): `host`, or `auto` for
    a CPU bank of float32 or float16."""
    on_host = bank_device_type == "cpu" and np.dtype(bank_dtype) in (np.float32, np.float16)
    return kernel == "host" or (kernel == "auto" and on_host)


def make_head(kernel, bank, bank_optimizer, stage=no_stage):
    """The head.Head of this rank: `host` (NumPy BLAS, float32/float16 CPU banks), `device` (MXNet
    operators on the bank's context), or `auto` = host where it applies; its softmax
    collectives are dist's."""
    if kernel not in HEAD_KERNELS:
        raise ValueError(f"head_kernel must be one of {HEAD_KERNELS}, got {kernel!r}")
    collectives = {"allreduce_max": dist.allreduce_max, "allreduce_sum": dist.allreduce_sum, "stage": stage}
    if uses_host_kernel(kernel, bank.ctx.device_type, bank.dtype):
        return HostHead(bank, bank_optimizer, threads=default_threads(dist.local_size()), **collectives)
    return DeviceHead(bank, bank_optimizer, **collectives)

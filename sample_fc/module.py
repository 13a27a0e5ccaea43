"""SampleDistributeModule: the Partial FC training step of one rank (docs/DESIGN.md, "One step")."""
import dataclasses
import json
import logging
import math
import time
import warnings

import mxnet as mx
import numpy as np

from . import dist
from .pfc.head import no_stage
from .initializers import backbone_initializer
from .options import ALLGATHERS
from .pfc.sampler import as_int_labels


@dataclasses.dataclass(frozen=True)
class StepRequests:
    """What a rank asks of the run through the step's one small collective; the ranks agree on
    each field's max, so every rank acts on it after the same step."""
    stop: float = 0.0         # the number of the signal that asked for a stop (0: none)
    checkpoint: float = 0.0   # 1: a checkpoint is due by the clock


@dataclasses.dataclass
class StepInfo:
    """What a batch-end callback is told after each update."""
    step: int              # number of updates done, 1-based
    loss: float            # mean loss over the global batch (the same on every rank)
    lr: float              # the backbone's
    global_batch: int
    seconds: float         # wall time of this step
    skipped: bool = False  # non-finite loss or gradients on some rank: nothing was updated
    grad_norm: float = math.nan  # global L2 norm of the backbone's summed gradients, before clipping
    agreed: StepRequests = dataclasses.field(default_factory=StepRequests)   # the ranks' requests, max over ranks
    bank_lr: float = math.nan    # the bank's (its own with bank_lr, or the backbone's lr)


def draws_random(symbol):
    """Whether `symbol` draws from MXNet's random generators in training: a Dropout of p > 0
    (dropout, a ViT's drop path) or one of MXNet's _random_* and _sample_* ops."""
    for node in json.loads(symbol.tojson())["nodes"]:
        if node["op"] == "Dropout" and float(node.get("attrs", {}).get("p", 0.5)) > 0:
            return True
        if node["op"].startswith(("_random_", "_sample_")):
            return True
    return False


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with non-finite loss or gradients."""


class SampleDistributeModule:
    """A data-parallel backbone, this rank's Partial FC layer and the collectives between them:
    one rank's part of a Partial FC run.

    `step(batch)` runs, in this order (rank r of W, b = batch_size, B = b * W):
      forward_backbone       1. the backbone on this rank's batch -> embeddings (b x D)
      loss_and_gradients     2. allgather the global batch: embeddings (B x D), integer labels
                             3-8. partial_fc (partial_fc.PartialFC): sample this rank's centers,
                                rows of the bank, cosine, margin, exact distributed softmax,
                                loss and gradients
                             the finite check's flags sent (not waited for)
                             9. reducescatter d loss / d embeddings to this rank's b rows,
                                then the backbone's backward
      sum_gradients          the backbone's gradients summed over the ranks and their norm; with
                             the flags: skip the step everywhere when any rank saw NaN/Inf
      apply_updates          10. partial_fc's update of the sampled bank rows; 11. the backbone's
                                update

    `symbol`: the backbone (input `data`, one output: the embeddings), or with `tail` (a
    pfc.global_tail.GlobalTail) its body, whose outputs are gathered and run through the tail on
    every rank to make the global batch's embeddings (tail_bn=global); `partial_fc`: this rank's
    PartialFC; `backbone_optimizer`: a BackboneOptimizer; `context`: one mx.Context or a list (the
    backbone's devices); `batch_size` per rank; `data_shape` of one sample; `allgather` strategy
    (dist.py); `max_nonfinite_steps` in a row before NonFiniteError; `seed`: the run's, from which a
    backbone that draws random numbers (dropout, a ViT's drop path) is reseeded before each update
    as a function of (seed, rank, update), so a resumed run draws what the uninterrupted one
    did. The run around the step is
    wired in with `connect` (the stage hook, the requests). Every rank must build the same
    module (same symbol and shapes): the steps are collectives.
    """

    def __init__(self, symbol, partial_fc, backbone_optimizer, *, context, batch_size, data_shape=(3, 112, 112),
                 allgather="native", max_nonfinite_steps=5, tail=None, seed=0):
        if allgather not in ALLGATHERS:
            raise ValueError(f"allgather must be one of {ALLGATHERS}, got {allgather!r}")
        self.contexts = list(context) if isinstance(context, (list, tuple)) else [context]
        if tail is not None and len(self.contexts) > 1:
            raise ValueError("a global tail needs one device per rank (its update uses the backbone's updater)")
        self.tail = tail
        self.partial_fc, self.backbone_optimizer = partial_fc, backbone_optimizer
        self.batch_size, self.allgather = batch_size, allgather
        self.max_nonfinite_steps = max_nonfinite_steps
        self.logger = logging.getLogger("sample_fc")
        self.num_update = 0
        self.nonfinite_in_a_row = self.nonfinite_total = 0
        self.last_grad_norm = math.nan    # of the last applied update (StepInfo.grad_norm)
        self.agreed = StepRequests()      # the last step's requests, each the max over ranks
        self.backbone = mx.mod.Module(symbol, data_names=("data",), label_names=None,
                                      context=self.contexts)
        self.seed, self._draws_random = seed, draws_random(symbol)
        self.backbone.bind(data_shapes=[("data", (batch_size,) + tuple(data_shape))], for_training=True)
        self._parts = [self.backbone] + ([tail.module] if tail else [])   # the backbone's bound modules
        self._stage_hook, self._requests = no_stage, StepRequests
        partial_fc.connect(self.stage)
        self._labels = None                 # this rank's integer labels of the current batch
        self._flags = None                  # this step's pending flags (send_flags)

    def connect(self, stage_hook=no_stage, requests=StepRequests):
        """Wire the run around the step: `stage_hook(name)` -> a context manager, told of each
        stage of the step as it runs (the step watchdog; a benchmark's timer); `requests()` ->
        this rank's StepRequests, agreed on in the step's first collective."""
        self._stage_hook, self._requests = stage_hook, requests

    def stage(self, name):
        """The stage hook's context for the block `name` of the step."""
        return self._stage_hook(name)

    # ---- set-up -----------------------------------------------------------------------
    def init_params(self, initializer=None, arg_params=None, aux_params=None):
        """Initialise the backbone (default: initializers "pytorch"), then call
        broadcast_parameters so all ranks agree."""
        initializer = initializer or backbone_initializer("pytorch")
        for part in self._parts:  # with a tail, arg_params hold both parts' (builder.initial_params)
            part.init_params(initializer=initializer, arg_params=arg_params, aux_params=aux_params,
                             allow_missing=False, allow_extra=self.tail is not None)
        param_names = self.backbone._exec_group.param_names
        kvstore = "local" if len(self.contexts) > 1 else None
        if kvstore is None:        # the tail's parameters are indexed after the body's
            tail_names = self.tail.param_names if self.tail else []
            self.backbone_optimizer.set_param_names(dict(enumerate(param_names + tail_names)))
        else:                   # update on the local kvstore: one index per parameter and device
            self.backbone_optimizer.set_param_names(
                {i * len(self.contexts) + k: n for i, n in enumerate(param_names)
                 for k in range(len(self.contexts))})
        with warnings.catch_warnings():   # rescale_grad 1.0 is intended: the loss is a global mean
            warnings.filterwarnings("ignore", message=".*rescale_grad is not normalized.*")
            self.backbone.init_optimizer(kvstore=kvstore, optimizer=self.backbone_optimizer)

    def broadcast_parameters(self, root_rank=0):
        """Make every rank's backbone parameters equal root_rank's."""
        arg_params, aux_params = self.get_params()
        params = {f"arg:{k}": v for k, v in arg_params.items()}
        params.update({f"aux:{k}": v for k, v in aux_params.items()})
        dist.broadcast_parameters(params, root_rank=root_rank, prefix="backbone")
        self.set_params(arg_params, aux_params)

    def get_params(self):
        """(arg_params, aux_params) of the whole backbone on this rank (body and tail)."""
        arg_params, aux_params = (dict(params) for params in self.backbone.get_params())
        if self.tail:
            tail_args, tail_aux = self.tail.get_params()
            arg_params.update(tail_args)
            aux_params.update(tail_aux)
        return arg_params, aux_params

    def set_params(self, arg_params, aux_params):
        """Set the whole backbone's parameters (every one must be given)."""
        for part in self._parts:
            part.set_params(arg_params, aux_params, allow_missing=False, allow_extra=self.tail is not None)

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
        arg_params, aux_params = self.get_params()
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
        """2-9 after forward_backbone: returns the global mean loss ((1,) NDArray). Sends the
        finite check's flags (send_flags) before the reducescatter, so that both collectives
        are negotiated together and the flags are back before the backward ends."""
        stage = self.stage
        outputs = self.backbone.get_outputs(merge_multi_context=True)[0]
        with stage("allgather"):      # 2. the global batch: embeddings (B x D), integer labels (B)
            rows = mx.nd.reshape(outputs, (self.batch_size, -1)) if self.tail else outputs
            gathered = dist.allgather(rows.as_in_context(self.tail.ctx if self.tail else self.partial_fc.ctx),
                                      "embeddings", self.allgather)
            all_labels = dist.allgather(mx.nd.array(self._labels, dtype="int64"), "labels").asnumpy()
        if self.tail:                 # the last layers on the global batch (pfc/global_tail.py)
            with stage("tail_forward"):
                gathered = self.tail.forward(gathered).as_in_context(self.partial_fc.ctx)
        # 3-8. sample (all local positives + negatives), sampled rows, cosine, margin, exact softmax, gradients
        loss, grad_gathered = self.partial_fc.forward_backward(gathered, all_labels, self.num_update + 1)
        with stage("finite_check"):
            self._flags = self.send_flags(loss, grad_gathered)
        if self.tail:                 # its partial gradients: linear in this rank's d loss / d embeddings
            with stage("tail_backward"):
                grad_gathered = self.tail.backward(grad_gathered)
        with stage("reducescatter"):  # 9. this rank's rows of d loss / d embeddings, summed over ranks
            grad_rows = dist.reducescatter_sum(grad_gathered, "embedding_grads")
        with stage("backbone_backward"):
            self.backbone.backward(out_grads=[mx.nd.reshape(grad_rows.as_in_context(self.contexts[0]),
                                                            outputs.shape)])
        return loss

    def send_flags(self, loss, grad_all_embeddings):
        """This rank's flags for the step's one small collective, sent and not waited for: a
        non-finite loss or d loss / d embeddings here (they share every factor of the bank-row
        gradients except the finite normalised rows), then this rank's `requests()` (a stop
        asked for by a signal, a checkpoint due by the clock). Returns the pending max over the
        ranks (sum_gradients reads it)."""
        check = mx.nd.add_n(loss.reshape(-1), mx.nd.sum(grad_all_embeddings).reshape(-1))
        local_bad = 0.0 if np.isfinite(check.asscalar()) else 1.0
        requests = dataclasses.astuple(self._requests())
        return dist.allreduce_max(mx.nd.array((local_bad,) + requests), "step.nonfinite")

    def sum_gradients(self):
        """The backbone's gradients summed over the ranks (one fused collective) and their global
        norm, which the optimizer clips to. True when this step is finite on every rank: the
        flags say so and the summed gradients' norm is finite (a NaN/Inf in any rank's backbone
        gradients is one in the sum; float32 overflow of the sum counts too). `agreed` then holds
        each request's max over the ranks, so every rank acts on them after the same step."""
        grad_arrays = [grads for part in self._parts for grads in part._exec_group.grad_arrays]
        self.last_grad_norm = self.backbone_optimizer.sum_gradients(grad_arrays, self.num_update + 1)
        flags = self._flags.asnumpy()
        self.agreed = StepRequests(*flags[1:].tolist())
        return flags[0] == 0.0 and math.isfinite(self.last_grad_norm)

    def apply_updates(self):
        """10-11: SGD-momentum on the sampled bank rows; the backbone's update with the gradients
        sum_gradients summed (clipped to the optimizer's global norm)."""
        self.num_update += 1
        with self.stage("bank_update"):
            self.partial_fc.update(self.num_update)
        with self.stage("backbone_update"):
            self.backbone.update()
            if self.tail:             # by the backbone's updater, at the indices after the body's
                first = len(self.backbone._exec_group.param_names)
                for index, (weights, grads) in enumerate(zip(self.tail.param_arrays, self.tail.grad_arrays), first):
                    self.backbone._updater(index, grads[0], weights[0])

    # ---- one step ---------------------------------------------------------------------
    def step(self, data_batch):
        """One full training step; returns (global mean loss, skipped).

        A step whose loss or gradients are non-finite on any rank changes nothing on any
        rank (BatchNorm statistics included); after max_nonfinite_steps such steps in a
        row NonFiniteError is raised.
        """
        aux_arrays = [aux for part in self._parts for aux in part._exec_group.aux_arrays]
        aux_before = [[a.copy() for a in per_context] for per_context in aux_arrays]
        if self._draws_random:
            state = int(np.random.SeedSequence([self.seed, dist.rank(), self.num_update + 1]).generate_state(1)[0])
            for context in self.contexts:
                mx.random.seed(state % 2 ** 31, ctx=context)
        with self.stage("forward"):
            self.forward_backbone(data_batch)
        loss = self.loss_and_gradients()
        with self.stage("gradient_sum"):
            finite = self.sum_gradients()
        if finite:
            self.apply_updates()
            self.nonfinite_in_a_row = 0
            return float(loss.asscalar()), False
        for saved, live in zip(aux_before, aux_arrays):
            for source, target in zip(saved, live):
                source.copyto(target)
        self.partial_fc.discard()
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
        """Train until `max_update` updates are done, or until the ranks agreed on a stop
        (agreed.stop, after that step's callbacks); the loop alone decides when to stop.

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
            info = StepInfo(self.num_update, loss, self.backbone_optimizer.lr_at(self.num_update),
                            global_batch, time.perf_counter() - start, skipped,
                            math.nan if skipped else self.last_grad_norm, self.agreed,
                            self.partial_fc.optimizer.lr_schedule(self.num_update))
            for callback in batch_end_callbacks:
                callback(info)
            if info.agreed.stop:
                break
        return self


"""Batch-end callbacks: progress, checkpoints, verification. The loop alone decides when
to stop; callbacks only observe (and, for checkpoints and verification, make every rank
take part in the same named collectives). What rank 0 records for programs besides
progress.jsonl and status.json: events.jsonl (append_event) and the latest verification's
pairs (save_verification_pairs), which python -m sample_fc.tools.report reads.
"""
import datetime
import math
import os
import time

import mxnet as mx
import numpy as np

from .. import dist
from ..config import write_json
from ..verification import pair_distances, score
from .run_root import EVENTS_FILE, VERIFICATION_DIR, append_record


class ProgressLogger:
    """Every `frequent` steps (rank 0): step, global samples/s, mean loss, lr, the mean global
    gradient norm of the backbone (before clipping) and, when `clip_grad_norm` > 0, the share
    of steps it clipped, then the ETA. All means are over the applied steps since the last line.
    samples/s is the training speed: the time `paused()` (seconds so far outside training:
    checkpoints, verification) grew by since the last line is not counted; the ETA counts it.

    The same scalars go to a tensorboardX SummaryWriter when one is given, and as a dict to
    `record` (run_root.append_progress: the file programs read) when one is given, with those
    `extra(step)` returns (center_probe.CenterProbe.scalars: not on the console line).
    """

    def __init__(self, frequent, max_update, logger, writer=None, clip_grad_norm=0.0, record=None,
                 paused=lambda: 0.0, extra=lambda step: {}):
        self.frequent, self.max_update, self.logger, self.writer = frequent, max_update, logger, writer
        self.clip_grad_norm, self.record, self.paused, self.extra = clip_grad_norm, record, paused, extra
        self._reset(time.perf_counter())

    def _reset(self, now):
        self._since, self._losses, self._norms, self._samples = now, [], [], 0
        self._paused_since = self.paused()

    def __call__(self, info):
        if info.skipped:                  # the module already warned; nothing was trained
            return
        self._losses.append(info.loss)
        self._norms.append(info.grad_norm)
        self._samples += info.global_batch
        if info.step % self.frequent and info.step != self.max_update:
            return
        now = time.perf_counter()
        elapsed = max(now - self._since, 1e-9)
        speed = self._samples / max(elapsed - (self.paused() - self._paused_since), 1e-9)
        steps = len(self._losses)         # applied steps since the last line
        loss, norm = sum(self._losses) / steps, sum(self._norms) / steps
        eta = datetime.timedelta(seconds=int((self.max_update - info.step) * elapsed / steps))
        clipped = ""
        if self.clip_grad_norm > 0:
            share = sum(n > self.clip_grad_norm for n in self._norms) / steps
            clipped = f" (clipped {100 * share:.0f}%)"
        own_bank_lr = not math.isnan(info.bank_lr) and info.bank_lr != info.lr
        bank_lr = f" (bank {info.bank_lr:.6f})" if own_bank_lr else ""
        self.logger.info("step %d/%d  %.1f samples/s  loss %.4f  lr %.6f%s  grad norm %.2f%s  eta %s",
                         info.step, self.max_update, speed, loss, info.lr, bank_lr, norm, clipped, eta)
        scalars = {"loss": loss, "lr": info.lr, "samples_per_s": speed, "grad_norm": norm}
        if own_bank_lr:
            scalars["bank_lr"] = info.bank_lr
        scalars.update(self.extra(info.step))
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(name, value, info.step)
        if self.record is not None:       # with the share of clipped steps when clipping is on
            share = {"clipped_share": share} if self.clip_grad_norm > 0 else {}
            self.record(dict(scalars, step=info.step, **share))
        self._reset(now)


class PeriodicCallback:
    """Call `action(step)` on every rank every `period` steps (0 = never)."""

    def __init__(self, period, action):
        self.period, self.action = period, action

    def __call__(self, info):
        if self.period and info.step % self.period == 0 and not info.skipped:
            self.action(info.step)


class VerificationRunner:
    """Verification on pair sets, split across all ranks (no rank idles at a barrier).

    targets: {name: (images uint8 (2P, H, W, 3), issame)}, the same on every rank;
    embed_fn(images uint8) -> embeddings (n, D) NumPy. Rank r embeds images r, r+W, ...;
    the embeddings are allgathered (named "verification.<name>.<step>") and every rank
    scores the whole set. Rank 0 logs, and keeps the best mean accuracy with its step in
    `<models_root>/best.json`. `last_pairs`: {name: (pair distances, issame)} of the last call.
    """

    def __init__(self, targets, embed_fn, logger, models_root=None, writer=None):
        self.targets, self.embed_fn, self.logger = targets, embed_fn, logger
        self.models_root, self.writer = models_root, writer
        self.best_accuracy, self.last, self.last_pairs = -1.0, {}, {}

    def _embed_all(self, name, images, step):
        rank, world = dist.rank(), dist.size()
        mine = self.embed_fn(images[rank::world]).astype(np.float32)
        gathered = dist.allgather(mx.nd.array(mine), f"verification.{name}.{step}").asnumpy()
        order = np.concatenate([np.arange(r, len(images), world) for r in range(world)])
        embeddings = np.empty_like(gathered)
        embeddings[order] = gathered
        return embeddings

    def __call__(self, step):
        embedded = {name: self._embed_all(name, images, step) for name, (images, _) in self.targets.items()}
        self.last = {name: score(embedded[name], issame) for name, (_, issame) in self.targets.items()}
        self.last_pairs = {name: (pair_distances(embedded[name]), np.asarray(issame, bool))
                           for name, (_, issame) in self.targets.items()}
        if dist.rank() != 0 or not self.last:
            return self.last
        for name, result in self.last.items():
            self.logger.info("step %d  %s", step, result.line(name))
            if self.writer is not None:
                self.writer.add_scalar(f"verification/{name}", result.accuracy, step)
                self.writer.add_scalar(f"verification_tar_at_far/{name}", result.tar_at_far, step)
        mean = sum(r.accuracy for r in self.last.values()) / len(self.last)
        if mean > self.best_accuracy:
            self.best_accuracy = mean
            if self.models_root:
                write_json(os.path.join(self.models_root, "best.json"),
                           {"step": step, "mean_accuracy": mean,
                            "accuracy": {n: r.accuracy for n, r in self.last.items()}})
        return self.last


def chance_loss(num_classes, margin):
    """The loss of a model that has learned nothing: every cosine 0, so K - 1 logits of 0 and the
    target's s psi(0) (CosFace: -s m3, ArcFace: -s sin m2): log(K - 1 + e^(s psi(0))) - s psi(0),
    about ln K + s m. `margin` is a CombinedMargin (with s)."""
    target = margin.s * float(margin.target(np.zeros(1, dtype=np.float32))[0][0])
    return float(np.logaddexp(np.log(num_classes - 1), target) - target) if num_classes > 1 else 0.0


class ChanceWatch:
    """Says once (never stops) when the loss has sat near chance for `window` steps after `start`
    (the warm-ups): its mean within `margin` nats of `chance` and the median gradient norm under
    `small_grad_norm`. `warn(line)` gets the line (the log and status.json)."""

    def __init__(self, chance, start, warn, window=200, margin=0.5, small_grad_norm=1.0):
        self.chance, self.start, self.warn = chance, start, warn
        self.window, self.margin, self.small_grad_norm = window, margin, small_grad_norm
        self.losses, self.norms, self.said = [], [], False

    def __call__(self, info):
        if self.said or info.skipped or info.step <= self.start:
            return
        self.losses = (self.losses + [info.loss])[-self.window:]
        self.norms = (self.norms + [info.grad_norm])[-self.window:]
        if len(self.losses) < self.window:
            return
        loss, norm = float(np.mean(self.losses)), float(np.median(self.norms))
        if loss >= self.chance - self.margin and norm < self.small_grad_norm:
            self.said = True
            self.warn(f"not learning: the loss has sat at {loss:.2f}, chance level {self.chance:.2f} for this "
                      f"run's classes and margin, with a gradient norm of {norm:.2f}, for the {self.window} steps "
                      f"up to step {info.step}; try a lower lr (on 5,000 real-image classes lr 0.8 per 512 sat here "
                      f"where 0.1 learned; an lr warm-up did not help) or a higher sample_ratio (see the sampling "
                      f"line at start)")


def append_event(models_root, kind, step, **fields):
    """One line of <root>/events.jsonl: {"event": kind, "step", "time" (epoch seconds), fields}.
    The events a report marks on the step axis: start (with the run's facts; a start at step > 0
    is a resume or a restart), checkpoint, verification, skipped (a non-finite step), not_learning,
    stop, end."""
    append_record(os.path.join(models_root, EVENTS_FILE),
                  dict(fields, event=kind, step=int(step), time=round(time.time(), 3)))


def save_verification_pairs(models_root, name, step, distances, issame):
    """<root>/verification/<name>.npz: the pair distances and labels of the latest verification
    of target `name` (written whole, then renamed), for the report's ROC."""
    folder = os.path.join(models_root, VERIFICATION_DIR)
    os.makedirs(folder, exist_ok=True)
    partial = os.path.join(folder, f".{name}.npz.partial")
    with open(partial, "wb") as handle:
        np.savez(handle, step=step, distances=np.asarray(distances, np.float32), issame=np.asarray(issame, bool))
    os.replace(partial, os.path.join(folder, f"{name}.npz"))

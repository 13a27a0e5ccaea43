"""What happens around the steps of a run: checkpoints (by steps, by the clock, at a stop and at
the end), verification, progress, the step watchdog, and a stop asked for by a signal.

Everything that changes what all ranks do is decided in the step's collective: each rank's
`requests()` (a stop's signal number, a checkpoint due by its clock) travels in the step's
existing small allreduce (module.send_flags), and every rank acts on the max over the ranks
after the same step (StepInfo.agreed).
"""
import dataclasses
import math
import os
import time

from .. import checkpoint, dist
from ..config import steps_of
from . import run_root
from .callbacks import (ChanceWatch, PeriodicCallback, ProgressLogger, VerificationRunner, append_event, chance_loss,
                        save_verification_pairs)
from .center_probe import CenterProbe
from .memory_plan import GB, peak_rss_bytes
from .scalar_log import open_scalar_log
from .stop import STOP_EXIT_BASE, signal_name
from ..module import StepRequests
from ..verification import Embedder, evaluate, raw_pixel_embed

CHECKPOINT_BYTES_PER_S = 0.6e9    # a checkpoint's write speed before one was timed
                                  # (a measured one: docs/benchmarks-history.md)


class RunEvents:
    """What happens around the steps of a run, on every rank: the step watchdog told of every
    step and stage, a checkpoint every ckpt_period steps and whenever the newest is ckpt_minutes
    old, verification every verify_period steps, progress lines on rank 0 (`callbacks`, for
    module.fit); `stop(step, number)` after a stop the ranks agreed on, and `end_of_run(step)`.
    Checkpoints and verification are collectives: every rank runs them. `stop_signals`: this
    rank's StopSignals (or None); its abort becomes `abort` (rank 0 records a stop cut short).
    `run`: the opened run's RunRecord (config, rank, world, logger, paths, symbol, plan, data);
    `status`: the job's RunStatus."""

    def __init__(self, run, module, watchdog, status, stop_signals=None, clock=time.monotonic):
        cfg, rank, logger = run.cfg, run.rank, run.parts.logger
        self.cfg, self.run, self.module, self.rank, self.logger = cfg, run, module, rank, logger
        self.world, self.watchdog, self.status_record, self.clock = run.world, watchdog, status, clock
        self.stop_signals, self.stopping_at, self.stop_done = stop_signals, None, False
        self.saved_steps, self.last_save, self.timed_a_checkpoint = set(), clock(), False
        self.paused_s = 0.0               # seconds in checkpoints and verification (not training speed)
        self.train_state = {"world_size": run.world, "num_classes": cfg.num_classes, "run_id": run.run_id,
                            "embedding_size": cfg.embedding_size, "config": cfg,
                            "partial_fc": dataclasses.asdict(module.partial_fc.options)}
        self.writer = writer = open_scalar_log(cfg, rank, run.models_root, run.run_id, logger)   # TensorBoard, W&B
        self.verifier = VerificationRunner(run.parts.targets, self.embed_images, logger, run.models_root, writer)
        self.step = 0                     # the last step a callback saw
        self.callbacks = [self.note_step, lambda info: watchdog.step_done(info.step, info.seconds),
                          self.note_agreed_stop, PeriodicCallback(cfg.ckpt_period, self.save), self.save_when_due,
                          PeriodicCallback(cfg.verify_period, self.verify)]
        if rank == 0:
            if cfg.not_learning_steps:
                self.callbacks.append(self.chance_watch(cfg, module.partial_fc))
            probe = CenterProbe(module.partial_fc.bank, cfg.frequent)
            self.callbacks[:0] = [probe, ProgressLogger(cfg.frequent, cfg.max_update, logger, writer,
                                                        cfg.clip_grad_norm, self.record_progress,
                                                        paused=lambda: self.paused_s,
                                                        extra=probe.scalars)]
            self.callbacks.append(PeriodicCallback(cfg.frequent, lambda step: self.status(step=step)))
        if stop_signals is not None:
            stop_signals.on_abort(self.abort)

    def chance_watch(self, cfg, partial_fc):
        """The not-learning watch over cfg.not_learning_steps steps after the warm-ups, at the
        chance loss of the classes the loss scores (all of them, or the sampled share when the
        loss is the uncorrected sampled softmax's)."""
        options = partial_fc.options
        start = max(steps_of(cfg.warmup_steps, cfg.max_update), cfg.margin_warmup_steps,
                    options.sample_ratio_warmup_steps)
        scored = (cfg.num_classes if options.sample_correction or options.sample_ratio >= 1.0
                  else math.ceil(options.sample_ratio * cfg.num_classes))
        return ChanceWatch(chance_loss(scored, partial_fc.margin_schedule(start + 1)), start, self.say_not_learning,
                           window=cfg.not_learning_steps)

    def requests(self):
        """This rank's StepRequests for the step's collective: `stop` (the number of the signal
        that asked for it, 0 for none) and `checkpoint` (1 when the newest checkpoint this job
        wrote, or its start, is ckpt_minutes old). The module asks for them (module.connect)."""
        minutes = self.cfg.ckpt_minutes
        due = bool(minutes) and self.clock() - self.last_save >= 60.0 * minutes
        return StepRequests(stop=float(self.stop_signals.requested if self.stop_signals else 0),
                            checkpoint=float(due))

    def event(self, kind, step, **fields):
        """Rank 0: one line of the run's events.jsonl (append_event)."""
        if self.rank == 0:
            append_event(self.run.models_root, kind, step, **fields)

    def record_progress(self, record):
        """Rank 0: a progress record into progress.jsonl, with the time; the share of clipped
        steps also to TensorBoard (the other scalars are ProgressLogger's)."""
        run_root.append_progress(self.run.models_root, dict(record, time=round(time.time(), 3)))
        if self.writer is not None and "clipped_share" in record:
            self.writer.add_scalar("clipped_share", record["clipped_share"], record["step"])

    def note_step(self, info):
        """Every step: remember it; a skipped (non-finite) step is an event."""
        self.step = info.step
        if info.skipped:
            self.event("skipped", info.step)

    def say_not_learning(self, line):
        """Rank 0: the not-learning warning, in the log, in status.json (`warning`) and as an event."""
        self.logger.warning(line)
        self.status(warning=line)
        self.event("not_learning", self.step, line=line)

    def status(self, **fields):
        """Rank 0: update the run's status.json (run_root.write_status)."""
        if self.rank == 0:
            run_root.write_status(self.run.models_root, **fields)

    def save(self, step):
        """Checkpoint `step` (checkpoint.save_checkpoint); its size and time in the log and the
        status, and a warning when a stop could not write one inside stop_grace_s."""
        self.saved_steps.add(step)
        start = self.clock()
        with self.watchdog.stage("checkpoint"):
            path = checkpoint.save_checkpoint(self.run.models_root, step, self.module, self.run.parts.symbol,
                                              self.run.parts.train_iter, self.train_state, self.cfg.ckpt_keep)
        seconds = self.clock() - start
        self.last_save = self.clock()
        self.paused_s += seconds
        self.status(step=step, checkpoint=path, checkpoint_step=step, checkpoint_seconds=round(seconds, 2))
        self.event("checkpoint", step, path=os.path.basename(path), seconds=round(seconds, 2))
        self.watchdog.progress()
        self.logger.info("step %d: checkpoint saved in %.1f s", step, seconds)
        if not self.timed_a_checkpoint:
            self.timed_a_checkpoint = True
            self.warn_if_a_stop_cannot_checkpoint(seconds, "the first checkpoint took")
        return path

    def announce_checkpoints(self, checkpoint_bytes, last_seconds=None):
        """Rank 0 at start: how big one checkpoint is and how long the last one took (or an
        estimate), with the warning when a stop could not write one inside its grace."""
        seconds = last_seconds or checkpoint_bytes / CHECKPOINT_BYTES_PER_S
        self.logger.info("one checkpoint: %.2f GB, %s; every %d steps%s; a stop (%s) checkpoints within "
                         "stop_grace_s=%g s", checkpoint_bytes / 1e9,
                         f"the last took {last_seconds:.1f} s" if last_seconds
                         else f"about {seconds:.0f} s (not yet timed)",
                         self.cfg.ckpt_period,
                         f" and {self.cfg.ckpt_minutes:g} minutes" if self.cfg.ckpt_minutes else "",
                         ", ".join(self.cfg.stop_signals) or "none", self.cfg.stop_grace_s)
        self.warn_if_a_stop_cannot_checkpoint(seconds, "the last checkpoint took" if last_seconds else
                                              "a checkpoint should take about")

    def warn_if_a_stop_cannot_checkpoint(self, seconds, what):
        """One warning when a checkpoint of `seconds` does not fit in the stop's grace."""
        if seconds > 0.8 * self.cfg.stop_grace_s:
            self.logger.warning("%s %.0f s, close to or over stop_grace_s=%g s: a stop (SIGTERM) may end "
                                "without its checkpoint; raise stop_grace_s (and the scheduler's grace: SLURM "
                                "KillWait, Kubernetes terminationGracePeriodSeconds)", what, seconds,
                                self.cfg.stop_grace_s)

    def note_agreed_stop(self, info):
        """From the step the ranks agreed to stop after, a stop cut short is recorded (abort)."""
        if info.agreed.stop:
            self.stopping_at = info.step

    def save_when_due(self, info):
        """The checkpoint by the clock: when the ranks agreed one is due (and the step has none)."""
        if info.agreed.checkpoint and info.step not in self.saved_steps:
            self.save(info.step)

    def verify(self, step):
        """Verification on the run's targets at `step`."""
        start = self.clock()
        with self.watchdog.stage("verification"):
            result = self.verifier(step)
        self.paused_s += self.clock() - start
        if result:
            self.status(verification={"step": step, "accuracy": {n: r.accuracy for n, r in result.items()}})
            self.event("verification", step, accuracy={n: r.accuracy for n, r in result.items()},
                       tar_at_far={n: r.tar_at_far for n, r in result.items()},
                       far=next(iter(result.values())).far)
            for name, (distances, issame) in (self.verifier.last_pairs.items() if self.rank == 0 else ()):
                save_verification_pairs(self.run.models_root, name, step, distances, issame)
        self.watchdog.progress()
        return result

    def embed_images(self, images):
        """Embeddings of uint8 NHWC images (made float32 a batch at a time) with the current weights.
        A new Embedder each time: a bound one given new weights by set_params embeds with stale ones
        (oneDNN's fused inference graph keeps what it folded at the first forward)."""
        arg_params, aux_params = self.module.get_export_params()
        embed = Embedder(self.run.parts.symbol, arg_params, aux_params, self.run.parts.ctx, self.cfg.image_size,
                         batch_size=self.cfg.batch_size)
        return embed(images)

    def stop(self, step, number):
        """The ranks agreed to stop after `step` (signal `number`): the step's checkpoint (unless
        it has one), the stop in status.json, and the line that says how to continue. Returns the
        exit code, 128 + number."""
        path = checkpoint.checkpoint_path(self.run.models_root, step)
        if step not in self.saved_steps:
            path = self.save(step)
        name, root = signal_name(number), self.run.models_root
        if self.rank == 0:
            self.status_record.stopped(step, name, checkpoint=path)
            self.event("stop", step, signal=name)
            self.logger.warning("stopped by %s after step %d, checkpoint %s; continue with: ./horovodrun.sh -np %d "
                                "--resume %s (or your launcher with train.py --resume %s)", name, step, path,
                                self.world, root, root)
        dist.barrier("stop.recorded")    # no rank exits (and makes the launcher end the others) before
        self.stop_done = True            # rank 0 has recorded the stop
        self.close_scalar_log()
        if self.stop_signals is not None:
            self.stop_signals.finished()
        return STOP_EXIT_BASE + number

    def abort(self, number, reason):
        """A stop cut short (StopSignals: a second signal, or the grace over): rank 0 records it
        when the ranks had agreed to stop (else the status stays: the job was killed), one line,
        and the process ends at once with 128 + number. No new checkpoint is complete."""
        if self.stop_done:               # the stop is complete: the launcher ends the last ranks
            os._exit(STOP_EXIT_BASE + number)
        if self.rank == 0 and self.stopping_at is not None:
            self.status_record.stopped(self.stopping_at, signal_name(number),
                                       note=f"ended at once by {reason}; the newest complete checkpoint stays")
        end_at_once(number, reason, self.rank)

    def end_of_run(self, step):
        """A run always ends with a checkpoint and a verification of its last step (unless the
        periods just did them), then logs the final accuracy next to the raw-pixel baseline."""
        if step not in self.saved_steps:
            self.save(step)
        if not self.cfg.verify_period or step % self.cfg.verify_period:
            self.verify(step)
        peaks = dist.allgather_object(peak_rss_bytes(), "end.peak_memory")
        self.event("end", step, peak_rss_bytes=peaks, planned_bytes=self.run.plan.total)
        for name, (images, issame) in (self.run.parts.targets.items() if self.rank == 0 else ()):
            baseline = evaluate(raw_pixel_embed, images, issame)
            self.logger.info("final %s: accuracy %.4f (raw-pixel cosine baseline %.4f)",
                             name, self.verifier.last[name].accuracy, baseline.accuracy)
        if self.rank == 0:
            self.say_peak_memory(max(peaks))
        self.close_scalar_log()

    def close_scalar_log(self):
        """Rank 0: the scalars' sinks written out and closed (a W&B run finished)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def say_peak_memory(self, peak):
        """Rank 0: the largest worker's peak resident memory beside the memory plan's total; a
        warning when the peak was above the plan (the plan is meant never to be)."""
        planned = self.run.plan.total
        line = (f"memory: peak {peak / GB:.2f} GB resident in the largest of {self.world} worker(s); "
                f"the memory plan said {planned / GB:.2f} GB per worker ({planned / peak:.2f}x)")
        if peak <= planned:
            self.logger.info(line)
        else:
            self.logger.warning(line + ": above the plan, which should never be; please report it with the run's "
                                       "config.json (python -m bench.memory measures the plan)")


def end_at_once(number, reason, rank=0):
    """End this process now with 128 + number, one line from rank 0: a stop cut short."""
    if rank == 0:
        print(f"train.py: stopped at once by {reason}: no checkpoint of this step; the newest complete "
              f"checkpoint is kept", flush=True)
    os._exit(STOP_EXIT_BASE + number)

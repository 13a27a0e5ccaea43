"""The record of an opened run: everything checked and chosen before anything is written.

builder.open_run makes one `RunRecord` per rank (no collectives, no writes); train.py, RunEvents
and the opening lines of the log take it whole. It is frozen: what is decided across the ranks
after opening (the run id, rank 0's) is a new record (`agreed`), not an edit.
"""
import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class RunRecord:
    cfg: Any                      # the resolved config (sample_fc.config's keys)
    rank: int
    world: int                    # workers in the job
    logger: Any                   # builder.setup_logger's, this rank's
    models_root: str
    run_id: str
    resume_from: Optional[str]    # the checkpoint continued, or None
    resumed_at: Optional[int]     # its step
    pretrained: Any               # (arg, aux) params of --pretrained, or None
    symbol: Any                   # the backbone (mx.sym.Symbol), embedding-scaled as cfg says
    cost: Any                     # symbols.cost.Cost of one image
    plan: Any                     # memory_plan.MemoryPlan, checked against this node
    sampling: Any                 # pfc.sampling_regime.Regime of the run's ratio, classes and batch
    train_iter: Any               # this rank's data iterator
    ctx: Any                      # the backbone's context
    bank_ctx: Any                 # the class centers' context
    targets: dict                 # {name: (images, issame)} verification sets found

    def agreed(self, run_id):
        """This record with the run id all ranks took (rank 0's)."""
        return dataclasses.replace(self, run_id=run_id)

    def log_opening(self, auto_lines=None, centers_line=None):
        """Rank 0's lines before the first step: memory plan, backbone cost, the automatic
        sample ratio (`auto_lines`, builder.resolve_auto's), the sampling regime (with its
        warning) and the centers' optimizer (`centers_line`: builder.centers_line)."""
        cfg, logger = self.cfg, self.logger
        logger.info("memory plan: %s", self.plan.summary())
        logger.info("backbone %s at %d px: %.2fM parameters, %.3f G multiply-adds per image",
                    cfg.network, cfg.image_size, self.cost.params / 1e6, self.cost.multiply_adds / 1e9)
        if (auto_lines or {}).get("sample_ratio"):
            logger.info(auto_lines["sample_ratio"])
        logger.info(self.sampling.line())
        if self.sampling.warning():
            logger.warning(self.sampling.warning())
        if centers_line:
            logger.info(centers_line)

    def facts(self, attempt):
        """What the report shows of this job (events.jsonl's start event): world size, machine,
        attempt, where it resumed from, the memory plan, the sampling regime, the backbone's cost."""
        plan, sampling = self.plan, self.sampling
        return {"world_size": self.world, "host": socket.gethostname(), "cores": os.cpu_count(), "attempt": attempt,
                "resumed_from": self.resume_from and os.path.basename(self.resume_from),
                "memory_plan": dict(dataclasses.asdict(plan), summary=plan.summary()),
                "sampling": dict(dataclasses.asdict(sampling), line=sampling.line(), warning=sampling.warning()),
                "backbone": {"params": int(self.cost.params), "multiply_adds": int(self.cost.multiply_adds)}}

"""The record of an opened run: everything checked and chosen before anything is written.

builder.open_run makes one `RunRecord` per rank (no collectives, no writes): the decisions, typed,
and apart from them the live objects the run works with (`RunParts`: logger, backbone, iterator,
contexts, verification sets); train.py, RunEvents and the opening lines of the log take it whole.
It is frozen: what is decided across the ranks after opening (the run id, rank 0's) is a new record
(`agreed`), not an edit.
"""
import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Tuple

if TYPE_CHECKING:             # the annotations' types only: importing this module imports no mxnet
    import logging

    import mxnet as mx
    import numpy as np
    from easydict import EasyDict
    from ..symbols.cost import Cost

    from ..pfc.sampling_regime import Regime
    from .memory_plan import Plan


@dataclass(frozen=True)
class RunParts:
    """What an opened run works with: live objects and loaded data (nothing here is saved or shown)."""
    logger: "logging.Logger"      # builder.setup_logger's, this rank's
    symbol: "mx.sym.Symbol"       # the backbone, embedding-scaled as cfg says
    pretrained: Optional[Tuple[dict, dict]]   # (arg, aux) params of --pretrained, or None
    train_iter: "mx.io.DataIter"  # this rank's data iterator
    ctx: "mx.Context"             # the backbone's context
    bank_ctx: "mx.Context"        # the class centers' context
    targets: Dict[str, Tuple["np.ndarray", "np.ndarray"]]   # {name: (images, issame)} verification sets found


@dataclass(frozen=True)
class RunRecord:
    """What was decided and checked (what the log, config.json, status and events.jsonl say), and
    the run's live `parts`."""
    cfg: "EasyDict"               # the resolved config (sample_fc.config's keys)
    rank: int
    world: int                    # workers in the job
    models_root: str
    run_id: str
    resume_from: Optional[str]    # the checkpoint continued, or None
    resumed_at: Optional[int]     # its step
    cost: "Cost"                  # of one image through the backbone
    plan: "Plan"                  # the memory plan, checked against this node
    sampling: "Regime"            # the sampling regime of the run's ratio, classes and batch
    parts: RunParts

    def agreed(self, run_id):
        """This record with the run id all ranks took (rank 0's)."""
        return dataclasses.replace(self, run_id=run_id)

    def log_opening(self, auto_lines=None, centers_line=None):
        """Rank 0's lines before the first step: memory plan, backbone cost, the automatic
        sample ratio (`auto_lines`, builder.resolve_auto's), the sampling regime (with its
        warning) and the centers' optimizer (`centers_line`: builder.centers_line)."""
        cfg, logger = self.cfg, self.parts.logger
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

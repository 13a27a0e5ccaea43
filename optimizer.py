"""The optimizers train.py uses, re-exported from the library (sample_fc/optimizers.py).

- WarmupMultiStepSchedule: lr(step), linear warm-up then a factor at each step boundary.
- BackboneOptimizer: wraps any mx.optimizer.Optimizer; sums gradients over the ranks.
- MemoryBankSGDOptimizer: SGD with momentum on the sampled rows of the class-center bank.
"""
from sample_fc.optimizers import BackboneOptimizer, WarmupMultiStepSchedule
from sample_fc.pfc.bank_optimizer import MemoryBankSGDOptimizer

__all__ = ["BackboneOptimizer", "MemoryBankSGDOptimizer", "WarmupMultiStepSchedule"]

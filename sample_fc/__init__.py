"""sample_fc: Partial FC for MXNet + Horovod.

The modules at this level are the training step and its runtime (README "Layout"):
dist, sampler, margin, softmax, memory_bank, head, host_head, partial_fc, module, optimizers, options,
config, checkpoint, callbacks, verification, builder, launch. Subpackages: data/ (iterators,
RecordIO, .bin, images), tools/ (command-line tools), bench/ (benchmarks).

Public names are re-exported lazily (PEP 562), so `import sample_fc.config` or the
command-line tools do not pay for importing mxnet/horovod until they need them, and
importing the package has no side effects.
"""
import importlib

_EXPORTS = {
    "class_center_sample": "sampler",
    "ClassCenterSampler": "sampler",
    "shard_range": "sampler",
    "margin_cross_entropy": "softmax",
    "CombinedMargin": "margin",
    "MemoryBank": "memory_bank",
    "SampleDistributeModule": "module",
    "PartialFC": "partial_fc",
    "PartialFCOptions": "partial_fc",
    "Sample": "sampler",
    "FaceRecordIter": "data",
    "SyntheticIter": "data",
    "BackboneOptimizer": "optimizers",
    "MemoryBankSGDOptimizer": "optimizers",
    "WarmupMultiStepSchedule": "optimizers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sample_fc' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)

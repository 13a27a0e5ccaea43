"""sample_fc: Partial FC for MXNet + Horovod.

The floors, each subpackage's __init__ docstring its map:
    pfc/         the Partial FC layer (sampler, margin, softmax, head kernels, memory bank)
    run/         a run's life (models root, request, events, stops, restarts, resume, launcher,
                 memory plan, GPUs)
    models/      saved backbones in and out (MXNet, .pth, .onnx)
    checkpoint/  the one owner of a checkpoint's files
    data/        iterators, RecordIO, .bin, images;  tools/  the command-line tools
    config/      the configuration: key table, presets (with the card's datasets), older runs' rules
    symbols/     the backbones: catalog.py names every network (family, shape, preset, measurements)
At this level: module.py (SampleDistributeModule: backbone + PartialFC + collectives), dist.py (the
only Horovod caller), builder.py (a run's parts from its config), errors.py, options.py, ranks.py,
optimizers.py, initializers.py, fused_ops.py, verification.py,
launch.py (`python -m sample_fc.launch`).

Public names are re-exported lazily (PEP 562), so `import sample_fc.config` or the
command-line tools do not pay for importing mxnet/horovod until they need them. Importing the
package has one side effect: unless the environment sets MXNET_SUBGRAPH_VERBOSE, it is set to 0,
so that MXNet does not print "Subgraph backend MKLDNN is activated." on every graph it binds
(each worker, each verification, each tool); the package imports before MXNet in every entry.
"""
import importlib
import os

os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

_EXPORTS = {
    "class_center_sample": "pfc.sampler",
    "ClassCenterSampler": "pfc.sampler",
    "shard_range": "pfc.sampler",
    "margin_cross_entropy": "pfc.device_head",
    "CombinedMargin": "pfc.margin",
    "MemoryBank": "pfc.memory_bank",
    "SampleDistributeModule": "module",
    "PartialFC": "pfc.partial_fc",
    "PartialFCOptions": "pfc.partial_fc",
    "Sample": "pfc.sampler",
    "FaceRecordIter": "data",
    "SyntheticIter": "data",
    "BackboneOptimizer": "optimizers",
    "MemoryBankSGDOptimizer": "pfc.bank_optimizer",
    "WarmupMultiStepSchedule": "optimizers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sample_fc' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)

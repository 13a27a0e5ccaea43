"""arcface_torch's step as a skilled PyTorch user runs it on a CPU: the same modules, math and
data, with the model and every batch in channels-last memory order (NHWC strides, which
oneDNN's convolutions take without reordering; `model.to(memory_format=torch.channels_last)` and
`images.contiguous(memory_format=torch.channels_last)`, the lines PyTorch's CPU performance guide
gives), images held in memory (no loader), torch's threads at the count that is fastest here (the
cores; measured: BENCHMARKS.md). bench.compare and bench.step_breakdown show it as the row
"tuned" beside arcface_torch as it runs ("yardstick": NCHW batches from its DataLoader)."""
import torch


def channels_last(backbone):
    """The backbone with its 4-d weights in channels-last order (the same values)."""
    return backbone.to(memory_format=torch.channels_last)


def channels_last_batches(batches):
    """(images, labels) of `batches` with each batch of images in channels-last order."""
    for images, labels in batches:
        yield images.contiguous(memory_format=torch.channels_last), labels

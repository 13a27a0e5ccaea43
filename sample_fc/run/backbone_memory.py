"""The backbone's memory from MXNet itself: the static memory plan of its bound graph.

MXNet plans the memory of a bound graph before it runs it: every internal array (each layer's
output, the gradients of the backward pass, temporaries), with arrays that are never alive at the
same time sharing storage. The executor states the plan's total in its debug string ("Total N MB
allocated", N in MiB, rounded down). Binding reserves the arguments and the plan's pool but
writes little of them, so few pages become resident (mbf at 112 px, batch 64: a 4.4 GiB plan in
0.05 s and 20 MB; r100: 0.17 GB); the executor is dropped at once.

    planned_graph_bytes(symbol, image_size, batch_size, training)   bytes of that plan (cached)
    backbone_memory(symbol, network, image_size, batch_size, ...)   the plan's backbone term

Without oneDNN the plan plus the parameters' copies is what a CPU worker's backbone takes
(tests/test_backbone_memory.py: 0.97 of the measured growth). oneDNN's kernels keep arrays
outside it (their own layouts of the layers' outputs and of the weights), by factors measured per
network (its descriptor's onednn_extra, ONEDNN_WEIGHT_COPIES; bench/memory.py). On a GPU the plan is read from the
same graph bound on the CPU; cuDNN's workspace and the CUDA context are not in it, and no GPU
was there to measure them (docs/scale-and-memory.md).
"""
import functools
import math
import re
from dataclasses import dataclass

import mxnet as mx

from ..symbols.cost import parameter_counts
from .. import symbols

_TOTAL = re.compile(r"Total (\d+) MB allocated")


def planned_graph_bytes(symbol, image_size, batch_size, training=True):
    """Bytes of MXNet's static memory plan for `symbol` bound on batches of `batch_size` RGB
    images of image_size px: the training graph (forward and backward, gradients of the
    parameters, none of the input) or, with training=False, the inference graph. An upper bound
    (the executor reports whole MiB, rounded down: one MiB is added)."""
    return _planned_bytes(symbol.tojson(), int(image_size), int(batch_size), bool(training))


@functools.lru_cache(maxsize=64)
def _planned_bytes(symbol_json, image_size, batch_size, training):
    symbol = mx.sym.load_json(symbol_json)
    requests = {name: ("write" if training and name != "data" else "null") for name in symbol.list_arguments()}
    # the input's type only (as Module.bind gives it): the rest inferred, so a float16 backbone's
    # weights are float16 (simple_bind without a type_dict takes every argument as float32)
    executor = symbol.simple_bind(mx.cpu(), grad_req=requests, type_dict={"data": "float32"},
                                  data=(batch_size, 3, image_size, image_size))
    found = _TOTAL.search(executor.debug_str())
    del executor
    if found is None:                   # an MXNet whose debug string says no total: no plan to read
        raise RuntimeError("MXNet's executor did not state its memory plan (no 'Total N MB allocated' line)")
    return (int(found.group(1)) + 1) * 2 ** 20


# Measured (bench/memory.py; docs/scale-and-memory.md has the table): what oneDNN's kernels keep beside
# MXNet's plan on a CPU: a share of the training graph's plan per network family (their own layouts of
# the layers' outputs; a network not measured takes the largest), growing as the square root of the plan
# past ONEDNN_KNEE bytes (mbf at 112 px: 0.50 of the plan at batch 16, 0.33 at 64, 0.20 at 128; a run's
# peak moves by ~3% between runs and steps: the shares hold that above), and copies of the weights in
# their layouts.
# The shares measured, per network, are its descriptor's onednn_extra (symbols/<family>.py)
ONEDNN_KNEE = 2e9
ONEDNN_WEIGHT_COPIES = 4.0
ONEDNN_INFERENCE_EXTRA = 4.0   # a verification's fused inference graph: oneDNN's arrays, x its plan
PARAMETER_COPIES = 3        # weights, gradients and the module's copy of the weights, besides the
                            # optimizer's state (SGD's momentum; AdamW's two moments)
VERIFY_PARAMETER_COPIES = 3  # a verification's: the exported weights, its module's, oneDNN's folded ones


def onednn_extra(network):
    """oneDNN's share above MXNet's plan for `network`: its descriptor's measured one, or the
    largest measured where none was."""
    measured = [net.onednn_extra for net in map(symbols.network, symbols.NETWORKS) if net.onednn_extra]
    return symbols.network(network).onednn_extra or max(measured)


def onednn_graph_bytes(graph, network):
    """Bytes oneDNN keeps beside a training graph MXNet plans at `graph` bytes: onednn_extra of it,
    of sqrt(ONEDNN_KNEE x graph) past the knee."""
    return int(onednn_extra(network) * (graph if graph <= ONEDNN_KNEE else math.sqrt(ONEDNN_KNEE * graph)))


@dataclass(frozen=True)
class BackboneMemory:
    """Bytes the backbone holds in one worker at a batch (the memory plan's backbone term)."""
    values: int                 # its parameters and BatchNorm statistics (a count, for the checkpoint)
    parameters: int             # (PARAMETER_COPIES + optimizer states) x 4 bytes x (parameters +
                                # BatchNorm statistics)
    graph: int                  # MXNet's plan of the training graph (planned_graph_bytes)
    kernels: int                # oneDNN's arrays outside the plan: onednn_graph_bytes and
                                # ONEDNN_WEIGHT_COPIES of the weights (0 on a GPU)
    verification: int           # the inference graph at the batch (and oneDNN's share of it on a CPU)
                                # and its copies of the weights (0: the run does not verify)

    @property
    def total(self):
        return self.parameters + self.graph + self.kernels + self.verification


def backbone_memory(symbol, network, image_size, batch_size, on_cpu=True, verifies=False, optimizer_states=1):
    """The BackboneMemory of `symbol` (backbone `network`) training on batches of `batch_size`
    images of image_size px, on a CPU (oneDNN) or a GPU; `verifies`: the run verifies (an
    inference graph of the same batch, bound at every verification); `optimizer_states`: arrays
    the optimizer keeps per parameter (options.OPTIMIZER_STATES)."""
    values = sum(parameter_counts(symbol, image_size))
    graph = planned_graph_bytes(symbol, image_size, batch_size)
    verification = 0
    if verifies:
        inference = planned_graph_bytes(symbol, image_size, batch_size, training=False)
        verification = int(inference * (1 + (ONEDNN_INFERENCE_EXTRA if on_cpu else 0))
                           + VERIFY_PARAMETER_COPIES * 4 * values)
    kernels = onednn_graph_bytes(graph, network) + int(ONEDNN_WEIGHT_COPIES * 4 * values) if on_cpu else 0
    copies = PARAMETER_COPIES + optimizer_states
    return BackboneMemory(values=values, parameters=copies * 4 * values, graph=graph, kernels=kernels,
                          verification=verification)

"""The global tail: the backbone's last layers, run on the gathered global batch on every rank.

A BatchNorm normalises each channel over the images of its batch and their pixels. In the
backbone's last layers the maps are 1 x 1 (MobileFaceNet's GDC BatchNorm) or vectors (every
network's embedding BatchNorm), so there each rank's statistics come from its own b images
only, where one process would use all B = b x W. With tail_bn=global the backbone is split
before the first such BatchNorm: the body runs on each rank's images as before, its outputs
(b x C) take the place of the embeddings in the step's allgather, and the tail (those
BatchNorms, the embedding layer between them) runs on the gathered B x C rows on every rank,
identically. Its BatchNorms then see the global batch: an exact synchronised BatchNorm with
no extra collective. The tail's backward on a rank's partial d loss / d embeddings is its
partial gradient (the backward is linear in it), so the reducescatter that follows sums the
input gradients and the backbone's fused allreduce sums the tail's parameter gradients, as
it does the body's. The saved symbol and parameters are the whole backbone's, as before.
"""
import json

import mxnet as mx
import numpy as np

from ..errors import UsageError

TAIL_INPUT = "tail_data"


def _is_per_sample(shape):
    """A BatchNorm input whose statistics come from the samples alone: a vector or 1 x 1 maps."""
    return len(shape) == 2 or all(side == 1 for side in shape[2:])


def split_tail(symbol, data_shape):
    """(body, tail, cut_shape, cut_dtype) of a backbone `symbol` (input `data` of `data_shape`,
    batch first, float32): the body's output is the input of the first BatchNorm over samples
    only, of per-sample shape cut_shape and type cut_dtype (float16 in a float16 backbone); the tail
    takes it as `tail_data`, flattened to (B, C), and ends in the backbone's output. UsageError when
    the network has no such BatchNorm, or its last layers read an earlier activation, or drop out at
    random (each rank would draw its own mask)."""
    graph = json.loads(symbol.tojson())
    nodes = graph["nodes"]
    internals = symbol.get_internals()
    _, shapes, _ = internals.infer_shape(data=data_shape)
    shape_of = dict(zip(internals.list_outputs(), shapes))
    cut = None
    for node in nodes:
        if node["op"] == "BatchNorm":
            source = nodes[node["inputs"][0][0]]
            if _is_per_sample(shape_of[source["name"] + "_output"]):
                cut = node["inputs"][0][0]
                break
    if cut is None:
        raise UsageError("tail_bn=global: the network has no BatchNorm over samples only (a vector or 1 x 1 "
                         "maps) to run on the global batch; use tail_bn=worker")
    kept, stack = set(), [head[0] for head in graph["heads"]]
    while stack:                        # the tail: what the output needs, up to the cut
        index = stack.pop()
        if index in kept or index == cut:
            continue
        node = nodes[index]
        if node["op"] != "null" and index < cut or node["name"] == "data":
            raise UsageError(f"tail_bn=global: the network's last layers read {node['name']}, an activation "
                             f"before {nodes[cut]['name']}; use tail_bn=worker")
        if node["op"] == "Dropout" and float(node.get("attrs", {}).get("p", 0)) > 0:
            raise UsageError(f"tail_bn=global: {node['name']} drops out at p={node['attrs']['p']} in the "
                             f"last layers, which every worker runs; set dropout=0 or tail_bn=worker")
        kept.add(index)
        stack.extend(source for source, _, _ in node["inputs"])
    cut_name = nodes[cut]["name"] + "_output"
    _, types, _ = internals.infer_type(data="float32")
    cut_dtype = dict(zip(internals.list_outputs(), types))[cut_name]
    cut_shape = tuple(shape_of[cut_name][1:])
    return internals[cut_name], _tail_symbol(graph, kept, cut, cut_shape), cut_shape, np.dtype(cut_dtype).name


def _tail_symbol(graph, kept, cut, cut_shape):
    """The nodes `kept`, in their order, reading `tail_data` (B, C) reshaped to (B,) + cut_shape
    where they read node `cut`."""
    nodes = graph["nodes"]
    new_nodes = [{"op": "null", "name": TAIL_INPUT, "inputs": []},
                 {"op": "Reshape", "name": TAIL_INPUT + "_reshape", "inputs": [[0, 0, 0]],
                  "attrs": {"shape": str((-1,) + cut_shape)}}]
    position = {cut: 1}
    for index in sorted(kept):
        node = dict(nodes[index])
        node["inputs"] = [[position[source], output, version] for source, output, version in node["inputs"]]
        position[index] = len(new_nodes)
        new_nodes.append(node)
    tail = {"nodes": new_nodes, "arg_nodes": [i for i, node in enumerate(new_nodes) if node["op"] == "null"],
            "heads": [[position[head[0]], head[1], head[2]] for head in graph["heads"]],
            "attrs": graph.get("attrs", {})}
    return mx.sym.load_json(json.dumps(tail))


class GlobalTail:
    """The tail (split_tail) bound for the global batch on `ctx`: forward(gathered (B, C) rows)
    -> embeddings (B, D); backward(d loss / d embeddings) -> d loss / d gathered rows. Its
    parameters, gradients and BatchNorm statistics are `module`'s (an mx.mod.Module); they
    are the same on every rank."""

    def __init__(self, tail_symbol, cut_shape, global_batch, ctx, dtype="float32"):
        columns = int(np.prod(cut_shape))
        self.module = mx.mod.Module(tail_symbol, data_names=(TAIL_INPUT,), label_names=None, context=ctx)
        self.module.bind(data_shapes=[mx.io.DataDesc(TAIL_INPUT, (global_batch, columns), dtype=dtype)],
                         for_training=True, inputs_need_grad=True)
        self.ctx, self.columns = ctx, columns
        group = self.module._exec_group          # bound once: the same arrays every step
        self.param_names, self.param_arrays = group.param_names, group.param_arrays
        self.grad_arrays, self.aux_arrays = group.grad_arrays, group.aux_arrays

    def get_params(self):
        """(arg_params, aux_params) as the tail holds them now (its forward moves the BatchNorm
        statistics and the backbone's updater its weights: Module's cached copies are stale)."""
        self.module._params_dirty = True
        return self.module.get_params()

    def forward(self, gathered):
        self.module.forward(mx.io.DataBatch(data=[gathered.as_in_context(self.ctx)]), is_train=True)
        return self.module.get_outputs()[0]

    def backward(self, grad_embeddings):
        self.module.backward(out_grads=[grad_embeddings.as_in_context(self.ctx)])
        return self.module.get_input_grads()[0]

"""Our own MXNet operators (sample_fc/_mx_ops.cc, an MXNet operator library built by setup.py)
and the graph rewrite that puts them into a backbone for training on the CPU.

MXNet 1.9 has no fast CPU PReLU: symbols/common.py builds it from relu, clip, a depthwise 1x1
convolution and an add, which took ~40% of an mbf training step on the CPU (BENCHMARKS.md:
"Where a CPU step's time goes"). `fuse(symbol)` replaces each of those four-node groups by one
`sample_fc_prelu` node with the same inputs (the data and `<name>_gamma`) and the same name, so
parameters, checkpoints and every output are unchanged: forward values and the data gradient
are the same bits, the slopes' gradient the same sum in another order (float rounding).

Only the training module runs the fused graph (builder.build_module, CPU contexts). Saved
models keep the composite form (standard operators: any MXNet, ONNX export, insightface's
tools read them). Without the library (not built: no C++ compiler at `pip install -e .`)
`fuse` returns the symbol unchanged and says once that training is slower.
"""
import glob
import json
import logging
import os
import struct

import mxnet as mx

from symbols.common import PRELU_PARTS

OP_NAME = "sample_fc_prelu"
_library = {}        # "loaded": whether this process's MXNet has the operators


def library_path():
    """The built operator library, or None."""
    found = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_mx_ops*.so")))
    return found[0] if found else None


def available():
    """True when the operator library is built and loaded into this process's MXNet (loads it once)."""
    if "loaded" not in _library:
        path, reason = library_path(), "it is not built"
        if path and not whole_elf(path):            # dlopen of a cut-short library kills the process (SIGBUS)
            reason = f"{path} is damaged (shorter than its ELF headers say)"
        elif path:
            try:
                mx.library.load(path, verbose=False)
                reason = None
            except mx.MXNetError as error:
                reason = f"{path} does not load: {str(error).strip().splitlines()[0]}"
        if reason:
            logging.getLogger(__name__).warning(
                "sample_fc's fused CPU operators are not available (%s): PReLU runs as four MXNet "
                "operators, an mbf step on the CPU about twice as slow (re-run scripts/bootstrap.sh, or "
                "pip install -e . with a C++ compiler)", reason)
        _library["loaded"] = reason is None
    return _library["loaded"]


def whole_elf(path):
    """Whether `path` is a 64-bit ELF file at least as long as its section header table's end."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
        size = os.path.getsize(path)
    except OSError:
        return False
    if len(header) < 64 or header[:5] != b"\x7fELF\x02":
        return False
    section_offset, = struct.unpack_from("<Q", header, 0x28)
    entry_size, count = struct.unpack_from("<HH", header, 0x3A)
    return section_offset + entry_size * count <= size


def fuse(symbol):
    """`symbol` with every PReLU of symbols.common.prelu as one sample_fc_prelu node; `symbol`
    itself when the library is not available or the symbol holds no such PReLU."""
    graph = json.loads(symbol.tojson())
    groups = prelu_groups(graph["nodes"])
    if not groups or not available():
        return symbol
    return mx.sym.load_json(json.dumps(rewrite(graph, groups)))


def prelu_groups(nodes):
    """{index of a PReLU's add node: (data entry, gamma entry, indices of its other three nodes)}
    for each PReLU built by symbols.common.prelu, found by its node names and wiring."""
    by_name = {node["name"]: index for index, node in enumerate(nodes)}
    groups = {}
    for index, node in enumerate(nodes):
        if node["op"] != "elemwise_add":
            continue
        part = {key: by_name.get(node["name"] + suffix) for key, suffix in PRELU_PARTS.items()}
        if None in part.values():
            continue
        relu, scaled, negative = nodes[part["relu"]], nodes[part["scaled"]], nodes[part["negative"]]
        data = negative["inputs"][0] if negative["op"] == "clip" else None
        if (relu["op"] != "relu" or scaled["op"] != "Convolution" or data is None
                or relu["inputs"] != [data] or [entry[0] for entry in node["inputs"]] != [part["relu"], part["scaled"]]
                or [entry[0] for entry in scaled["inputs"]] != [part["negative"], part["gamma"]]):
            continue
        groups[index] = (data, scaled["inputs"][1], (part["relu"], part["scaled"], part["negative"]))
    return groups


def rewrite(graph, groups):
    """The graph (MXNet's JSON form) with each group's add node replaced by one fused node and
    its other three nodes dropped; every node index renumbered."""
    dropped = {inner for _, _, inners in groups.values() for inner in inners}
    new_index, nodes = {}, []
    for index, node in enumerate(graph["nodes"]):
        if index in dropped:
            continue
        if index in groups:
            data, gamma, _ = groups[index]
            node = {"op": OP_NAME, "name": node["name"], "inputs": [data, gamma]}
        new_index[index] = len(nodes)
        nodes.append(node)

    def entry(old):
        if old[0] not in new_index:
            raise ValueError(f"node {graph['nodes'][old[0]]['name']} of a fused PReLU is used outside it")
        return [new_index[old[0]]] + list(old[1:])
    for node in nodes:
        node["inputs"] = [entry(old) for old in node["inputs"]]
    return {"nodes": nodes,
            "arg_nodes": [new_index[i] for i in graph["arg_nodes"]],
            "heads": [entry(old) for old in graph["heads"]],
            "attrs": graph.get("attrs", {})}

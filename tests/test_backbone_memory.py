"""Tests for sample_fc.run.backbone_memory: MXNet's plan of a bound graph against the memory a
backbone really takes when oneDNN is off, its growth with the batch, and the backbone term by hand."""
import dataclasses
import json
import os
import subprocess
import sys

import mxnet as mx
import pytest

from sample_fc import symbols
from sample_fc.run import backbone_memory
from sample_fc.run.backbone_memory import BackboneMemory, planned_graph_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Trains a backbone through mx.mod.Module as module.py binds it (no input gradient), two steps of
# SGD with momentum, and prints the resident memory before the bind and the peak after (VmHWM: a
# child's ru_maxrss starts at its parent's, here pytest's).
TRAIN_TWO_STEPS = """
import json, resource, sys
import mxnet as mx, numpy as np
from sample_fc import symbols
network, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
symbol = symbols.get_symbol(network, 512, size)
x = mx.nd.array(np.random.default_rng(0).uniform(0, 255, (batch, 3, size, size)))
mx.nd.waitall()
before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=mx.cpu())
module.bind(data_shapes=[("data", (batch, 3, size, size))], for_training=True)
module.init_params(mx.init.Xavier())
module.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.01, "momentum": 0.9})
for _ in range(2):
    module.forward(mx.io.DataBatch([x]), is_train=True)
    module.backward([mx.nd.ones((batch, 512))])
    module.update()
    mx.nd.waitall()
peak = [int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print(json.dumps({"before": before, "peak": peak}))
"""


def test_mxnets_plan_is_what_the_graph_takes_without_onednn():
    """Test that, with oneDNN off (MXNET_MKLDNN_ENABLED=0: MXNet's own kernels, which allocate
    only what the executor planned), the resident memory a backbone's two training steps add is
    MXNet's plan of the graph plus the parameters' copies (weights, gradients, momentum, the
    module's copy), within 10%: mbf_small at 64 px, batch 32, measured in a process of its own."""
    symbol = symbols.get_symbol("mbf_small", 512, 64)
    memory = backbone_memory.backbone_memory(symbol, "mbf_small", 64, 32, on_cpu=False)
    env = dict(os.environ, MXNET_MKLDNN_ENABLED="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", TRAIN_TWO_STEPS, "mbf_small", "64", "32"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    grown = measured["peak"] - measured["before"]
    planned = memory.graph + memory.parameters
    assert memory.graph > 100e6 and 0.9 <= planned / grown <= 1.1, (planned, grown)


def test_the_plan_grows_with_the_batch_and_inference_needs_far_less():
    """Test that the training graph's plan at batch 64 is 4x its plan at 16 (within the 1 MiB the
    executor's rounding leaves), and that the inference graph (no backward) plans under a fifth
    of the training graph's bytes."""
    symbol = symbols.get_symbol("mbf", 512, 32)
    small, large = planned_graph_bytes(symbol, 32, 16), planned_graph_bytes(symbol, 32, 64)
    assert abs(large - 4 * small) <= 4 * 2 ** 20 and large > 300e6
    assert planned_graph_bytes(symbol, 32, 64, training=False) < large / 5


def test_a_float16_backbone_is_planned_as_training_binds_it():
    """Test that a float16 backbone (fp16=true on GPUs: its convolutions' weights are float16) is
    planned: bound with the input's type only, as Module.bind does (simple_bind without a type took
    every weight as float32 and refused the graph, so train.py --set fp16=true died in its memory
    check), planning no more than the float32 backbone."""
    half, full = (symbols.get_symbol("mbf_small", 512, 32, dtype) for dtype in ("float16", "float32"))
    planned = planned_graph_bytes(half, 32, 16)
    assert 0 < planned <= planned_graph_bytes(full, 32, 16)


def test_the_backbone_term_by_hand():
    """Test the backbone term of an FC + BatchNorm network: 4 copies of its 4-byte values
    (weight 48 x 10, bias 10, gamma, beta, moving mean and var 10 each), the graph as MXNet plans
    it, oneDNN's share of it and its copies of the weights on a CPU and none on a GPU, and a
    verification's inference graph (with oneDNN's share on a CPU) and 3 more copies only when
    the run verifies."""
    data = mx.sym.var("data")
    symbol = mx.sym.BatchNorm(mx.sym.FullyConnected(mx.sym.Flatten(data), num_hidden=10, name="fc"), name="bn")
    values = 48 * 10 + 10 + 4 * 10
    cpu = backbone_memory.backbone_memory(symbol, "mbf", 4, 8, on_cpu=True)
    gpu = backbone_memory.backbone_memory(symbol, "mbf", 4, 8, on_cpu=False, verifies=True)
    graph = planned_graph_bytes(symbol, 4, 8)
    kernels = int(graph * 0.70) + int(backbone_memory.ONEDNN_WEIGHT_COPIES * 4 * values)
    assert cpu == BackboneMemory(values=values, parameters=16 * values, graph=graph, kernels=kernels,
                                 verification=0)
    inference = planned_graph_bytes(symbol, 4, 8, training=False)
    assert gpu.kernels == 0 and gpu.verification == inference + 12 * values
    verifying = backbone_memory.backbone_memory(symbol, "mbf", 4, 8, on_cpu=True, verifies=True)
    assert verifying.verification == int(inference * (1 + backbone_memory.ONEDNN_INFERENCE_EXTRA) + 12 * values)
    assert cpu.total == 16 * values + graph + cpu.kernels


@pytest.mark.parametrize("network, share", [("r50", 0.50), ("r100", 0.50), ("mbf", 0.70), ("mbf_small", 0.80)])
def test_onednn_share_by_network(network, share, monkeypatch):
    """Test that each network takes its measured share (IResNets one, MobileFaceNets their own:
    docs/benchmarks-history.md), a network never measured takes the largest, an unknown name is
    UnknownNetwork (never another network's share); and that the share grows with the plan up to
    the knee and as its square root past it (a plan 4x the knee: twice the knee's share)."""
    assert backbone_memory.onednn_extra(network) == share
    unmeasured = dataclasses.replace(symbols.network("r50"), name="r50_new", onednn_extra=None)
    monkeypatch.setitem(symbols._NETWORKS, "r50_new", unmeasured)
    monkeypatch.setattr(symbols, "NETWORKS", symbols.NETWORKS + ("r50_new",))
    assert backbone_memory.onednn_extra("r50_new") == 0.80
    with pytest.raises(symbols.UnknownNetwork, match="convnext_t"):
        backbone_memory.onednn_extra("convnext_t")
    knee = backbone_memory.ONEDNN_KNEE
    assert backbone_memory.onednn_graph_bytes(knee / 2, network) == int(share * knee / 2)
    assert backbone_memory.onednn_graph_bytes(4 * knee, network) == int(share * 2 * knee)

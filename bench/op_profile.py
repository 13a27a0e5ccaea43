"""Where a backbone's training step spends its time, by operator: sample_fc's (MXNet's profiler)
beside arcface_torch's own module (torch.profiler), one process each in turn, the same batch
of random images, the same threads.

    python -m bench.op_profile --network vit_t_dp005_mask0 --image-size 64 --batch 32 \\
        --arcface-torch /tmp/arcface_torch

sample_fc's side is the backbone as training runs it on the CPU (builder.build_module: our fused
operators, `--no-fuse` for MXNet's composite forms) with a loss on its embeddings and SGD with
momentum; each operator's time per step (forward, backward and update, MXNet's engine run op by
op: bulk execution off, so that each is timed alone). arcface_torch's side is its get_model
backbone (channels-last, as a tuned user runs it) with the same loss and SGD; each operator's
self time per step. The head (Partial FC) is left out: it is the same small part on both sides.
"""
import argparse
import ctypes
import json
import os
import time

import numpy as np

# MXNet times each operator only when the engine runs them one by one
os.environ.setdefault("MXNET_EXEC_BULK_EXEC_TRAIN", "0")


def mxnet_rows(network, image_size, batch, steps, fuse, threads):
    """[(ms per step, calls per step, operator)] of sample_fc's backbone step, and its ms per step."""
    import mxnet as mx
    from sample_fc import symbols
    from sample_fc import fused_ops
    openmp_threads = ctypes.CDLL("libgomp.so.1").omp_get_max_threads()
    if openmp_threads != threads:
        raise SystemExit(f"error: MXNet's OpenMP runs {openmp_threads} threads, not --threads {threads}: "
                         "an OpenMP runtime was loaded before op_profile set OMP_NUM_THREADS (set it yourself)")
    symbol = symbols.get_symbol(network, 512, image_size)
    if fuse:
        symbol = fused_ops.fuse(symbol, (batch, 3, image_size, image_size))
    loss = mx.sym.make_loss(mx.sym.mean(mx.sym.square(symbol)))
    module = mx.mod.Module(loss, data_names=["data"], label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", (batch, 3, image_size, image_size))])
    module.init_params(mx.init.Xavier())
    module.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 1e-4, "momentum": 0.9})
    images = mx.io.DataBatch([mx.nd.array(np.random.default_rng(0).random((batch, 3, image_size, image_size)))])

    def step():
        module.forward(images, is_train=True)
        module.backward()
        module.update()
    for _ in range(3):
        step()
    mx.nd.waitall()
    mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=os.devnull)
    start = time.perf_counter()
    mx.profiler.set_state("run")
    for _ in range(steps):
        step()
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    per_step = (time.perf_counter() - start) / steps * 1e3
    stats = json.loads(mx.profiler.dumps(format="json", reset=True)).get("Time", {}).get("operator", {})
    rows = [(s["Total"] / steps, s["Count"] / steps, name) for name, s in stats.items()]
    return sorted(rows, reverse=True), per_step


def torch_rows(directory, network, image_size, batch, steps):
    """[(ms per step, calls per step, operator)] of arcface_torch's backbone step (self times),
    and its ms per step."""
    import torch
    from .yardstick import upstream
    model = upstream.build_network(upstream.load(directory), network, image_size).to(
        memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    images = torch.from_numpy(np.random.default_rng(0).random((batch, 3, image_size, image_size),
                                                              dtype=np.float32)).to(memory_format=torch.channels_last)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(images).square().mean().backward()
        optimizer.step()
    for _ in range(3):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        per_step = (time.perf_counter() - start) / steps * 1e3
    rows = [(event.self_cpu_time_total / 1e3 / steps, event.count / steps, event.key)
            for event in profile.key_averages() if event.self_cpu_time_total > 0]
    return sorted(rows, reverse=True), per_step


def print_rows(title, rows, per_step, top):
    """The `top` operators of `rows`, their ms per step and share of the operators' total."""
    total = sum(ms for ms, _, _ in rows)
    print(f"\n{title}: {per_step:.1f} ms per step (profiled), operators {total:.1f} ms")
    for ms, calls, name in rows[:top]:
        print(f"  {ms:9.2f} ms {100 * ms / total:5.1f}%  x{calls:<6g} {name[:90]}")


def main(argv=None):
    from sample_fc.symbols.catalog import NETWORKS     # MXNet-free: OpenMP is not loaded yet
    parser = argparse.ArgumentParser(prog="python -m bench.op_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--network", default="vit_t_dp005_mask0", choices=NETWORKS, metavar="NAME",
                        help="a network of sample_fc/symbols/catalog.py (default %(default)s)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 unprofiled ones)")
    parser.add_argument("--threads", type=int, default=1, help="threads of each side (OMP_NUM_THREADS, torch's)")
    parser.add_argument("--top", type=int, default=20, help="operators listed per side")
    parser.add_argument("--no-fuse", action="store_true", help="sample_fc's side without our fused operators")
    parser.add_argument("--arcface-torch", metavar="DIR",
                        help="a checkout of insightface's recognition/arcface_torch: profile its module too")
    args = parser.parse_args(argv)
    for option, value in (("--threads", args.threads), ("--batch", args.batch), ("--steps", args.steps),
                          ("--image-size", args.image_size)):
        if value < 1:
            parser.error(f"{option} must be at least 1, got {value}")
    if args.image_size % 16:
        parser.error(f"--image-size must be a multiple of 16 (every backbone downsamples by 16), got {args.image_size}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)      # before anything loads an OpenMP runtime
    if args.arcface_torch:
        from .yardstick.upstream import not_arcface_torch
        problem = not_arcface_torch("--arcface-torch", args.arcface_torch)
        if problem:
            parser.error(problem)
    rows, per_step = mxnet_rows(args.network, args.image_size, args.batch, args.steps, not args.no_fuse,
                                 args.threads)
    print(f"{args.network} at {args.image_size} px, batch {args.batch}, {args.threads} thread(s), "
          f"{args.steps} steps")
    print_rows("sample_fc" + (" (MXNet's composite operators)" if args.no_fuse else ""), rows, per_step, args.top)
    if args.arcface_torch:
        import torch
        torch.set_num_threads(args.threads)
        rows, per_step = torch_rows(args.arcface_torch, args.network, args.image_size, args.batch, args.steps)
        print_rows("arcface_torch (channels-last)", rows, per_step, args.top)


if __name__ == "__main__":
    main()

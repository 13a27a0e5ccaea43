"""Tests for sample_fc.run.memory_plan: the per-worker arithmetic against hand-computed cases, the
refusal line and its ways out."""
import pytest

from sample_fc.pfc.row_storage import Storage
from sample_fc.run import memory_plan
from sample_fc.errors import UsageError


def test_plan_of_20m_classes_on_two_workers_by_hand():
    """Test the plan of 20,000,000 classes x 512 on 2 workers of batch 128 at ratio 0.1, host
    kernel, one thread: every term written out by hand (the backbone's and the data's given)."""
    p = memory_plan.plan(20_000_000, 2, 512, 128, 0.1, backbone_bytes=123_456_789,
                         backbone_params=1_000_000, data_bytes=7_000_000, host_kernel=True, threads=1)
    assert (p.num_local, p.sampled, p.global_batch) == (10_000_000, 1_000_000, 256)
    assert p.bank == 2 * 10_000_000 * 512 * 4 == 40_960_000_000
    assert p.sampler == 9 * 10_000_000 + 8 * 1_000_000 == 98_000_000
    assert p.head == 4 * (1_000_000 * 512 + 2 * 256 * 1_000_000 + 3 * 256 * 512 + 3 * 512 * 512)
    assert (p.backbone, p.data) == (123_456_789, 7_000_000)
    assert p.total == p.bank + p.sampler + p.head + 123_456_789 + 7_000_000 + memory_plan.RUNTIME_BYTES
    assert p.checkpoint == 8 * 20_000_000 * 512 + 8 * 1_000_000 + 2 ** 20
    assert p.allgather_per_step == 256 * (4 * 512 + 8)


def test_the_sample_grows_to_the_batch_and_stops_at_the_shard():
    """Test that the rows scored per step are the sample, at least the global batch (every
    positive stays), at most the shard; and the largest shard of an uneven split counts."""
    assert memory_plan.plan(1000, 3, 8, 64, 0.1).sampled == 192           # 34 sampled < 192 positives
    assert memory_plan.plan(1000, 3, 8, 64, 0.1).num_local == 334
    assert memory_plan.plan(100, 1, 8, 256, 0.1).sampled == 100           # at most the shard
    whole = memory_plan.plan(100, 1, 8, 256, 1.0)        # every row of a float32 shard: the bank itself
    assert whole.head == 4 * (2 * 256 * 100 + 3 * 256 * 8 + 3 * 512 * 8)
    half = memory_plan.plan(100, 1, 8, 256, 1.0, storage=Storage("float16"))   # float16: its rows are gathered
    assert half.head == whole.head + 4 * 100 * 8
    device = memory_plan.plan(1000, 1, 8, 4, 0.5, host_kernel=False)
    assert device.head == 4 * (6 * 500 * 8 + 8 * 4 * 500)
    with pytest.raises(ValueError, match="world"):
        memory_plan.plan(3, 4, 8, 4, 0.5)


def replan_20m(world=2, batch_size=128, bank_dtype="float32", bank_on_gpu=False, bank_momentum="same"):
    """The (host plan, no GPU plan) of 20,000,000 classes x 512 at ratio 0.1, as builder's replan."""
    return memory_plan.plan(20_000_000, world, 512, batch_size, 0.1, Storage(bank_dtype, bank_momentum)), None


def test_a_plan_that_does_not_fit_is_one_line_naming_needed_and_available():
    """Test that check_fits passes a plan within the share of memory and refuses one over it
    with the GB needed and available, the workers sharing it, and the ways out with the GB
    each gives (ways_out: -np doubled until it fits, float16, the batch halved)."""
    p = memory_plan.plan(20_000_000, 2, 512, 128, 0.1)
    memory_plan.check_fits(p, 2 * p.total, local_workers=2)

    def ways(share):
        return memory_plan.ways_out(replan_20m, 0, share, 2, 128, 20_000_000, Storage(), False)
    with pytest.raises(UsageError) as error:
        memory_plan.check_fits(p, 24e9, local_workers=2, ways=ways)
    message = str(error.value)
    assert f"needs {p.total / 1e9:.1f} GB of host memory per worker (bank 41.0 GB for 10,000,000 classes" in message
    assert "and 12.0 GB are available (24.0 GB shared by 2 worker(s) on this node)" in message
    sixteen = memory_plan.plan(20_000_000, 16, 512, 128, 0.1)       # -np 8: a 10.2 GB bank + 2.6 GB step
    assert memory_plan.plan(20_000_000, 8, 512, 128, 0.1).total > 12e9 >= sixteen.total
    assert f"ways out: more workers: -np 16 ({sixteen.total / 1e9:.1f} GB per worker)" in message
    half = memory_plan.plan(20_000_000, 2, 512, 128, 0.1, storage=Storage("float16"))
    assert f"bank_dtype=float16, half the bank ({half.total / 1e9:.1f} GB per worker, still over)" in message
    eight = memory_plan.plan(20_000_000, 2, 512, 128, 0.1, storage=Storage("int8", "none"))   # 544 B a row
    assert eight.bank == 10_000_000 * (512 + 4 * 8) and eight.total < 12e9
    assert f"bank_dtype=int8 with bank_momentum=none, 8-bit centers ({eight.total / 1e9:.1f} GB per worker)" in message
    tiny = memory_plan.plan(20_000_000, 2, 512, 1, 0.1)              # the bank does not shrink with the batch
    assert f"a smaller batch: batch_size=1 ({tiny.total / 1e9:.1f} GB per worker, still over)" in message
    assert "\n" not in message
    memory_plan.check_fits(p, None, local_workers=2)                      # unknown: no check
    half = memory_plan.plan(20_000_000, 2, 512, 128, 0.1, storage=Storage("float16"))
    assert half.bank == p.bank // 2 and half.checkpoint == 2 * 2 * 20_000_000 * 512 + 2 ** 20
    assert half.head == p.head             # float16 rows become float32 rows in one pass (no staging)


def test_ways_out_put_the_batch_first_when_the_backbone_dominates_and_offer_the_host_bank():
    """Test that when the backbone is the largest term the smaller batch comes first, naming the
    backbone's GB, halved until it fits; and that a GPU bank is offered on the host with the GPU
    and host GB it gives, and the centers without momentum (which a GPU bank runs too) with its GB."""
    def replan(world=8, batch_size=128, bank_dtype="float32", bank_momentum="same", bank_on_gpu=True):
        whole = memory_plan.plan(400_000, world, 512, batch_size, 0.1, Storage(bank_dtype, bank_momentum),
                                 backbone_bytes=4 * (3 * 65_000_000 + 2 * batch_size * 48_000_000),
                                 backbone_params=65_000_000, host_kernel=False)
        on_gpu = dict(bank=whole.bank, sampler=whole.sampler, head=whole.head) if bank_on_gpu else dict(bank=0, sampler=0, head=0)
        device = memory_plan.Plan(**{**whole.__dict__, "runtime": 0, **on_gpu})
        host = memory_plan.Plan(**{**whole.__dict__, "backbone": 0,
                                   **({"bank": 0, "sampler": 0, "head": 0} if bank_on_gpu else {})})
        return host, device
    current = replan()[1]
    assert current.backbone > max(current.bank, current.head)
    ways = memory_plan.ways_out(replan, 1, 16e9, 8, 128, 400_000, Storage(), True)
    forty = replan(batch_size=32)[1]
    assert replan(batch_size=64)[1].total > 16e9 >= forty.total
    assert ways[0] == (f"a smaller batch: batch_size=32 ({forty.total / 1e9:.1f} GB per worker) — the backbone, "
                       f"{current.backbone / 1e9:.1f} GB at batch 128, is the largest term")
    host, device = replan(bank_on_gpu=False)
    assert (f"the bank on the host, bank_context=cpu (GPU memory {device.total / 1e9:.1f} GB per worker, still over; "
            f"host memory then holds {host.total / 1e9:.1f} GB per worker)") in ways
    without = replan(bank_momentum="none")[1]
    assert without.bank == current.bank / 2
    assert f"bank_momentum=none, no momentum for the centers ({without.total / 1e9:.1f} GB per worker, still over)" in ways
    assert not any("bank_momentum=int8" in way or "bank_dtype=int8" in way for way in ways)     # the host kernel's


def test_the_bank_counts_its_momentum_as_stored_and_int8_is_a_way_out_for_float16():
    """Test that the plan's bank and checkpoint hold weights plus the momentum as stored (int8:
    D + 4 ceil(D / 64) bytes a row; none: 0), by hand for 20,000,000 classes x 512 on 2 workers; and
    that a float16 host bank over its share is offered bank_momentum=int8 with the GB it gives
    (not a bank on the GPU or run by the device kernel, which int8 momentum cannot have)."""
    rows, classes = 10_000_000, 20_000_000
    for dtype, itemsize in (("float32", 4), ("float16", 2)):
        same = memory_plan.plan(classes, 2, 512, 128, 0.1, Storage(dtype))
        int8 = memory_plan.plan(classes, 2, 512, 128, 0.1, Storage(dtype, "int8"))
        none = memory_plan.plan(classes, 2, 512, 128, 0.1, Storage(dtype, "none"))
        assert same.bank == rows * 2 * 512 * itemsize
        assert int8.bank == rows * (512 * itemsize + 512 + 4 * 8)
        assert none.bank == rows * 512 * itemsize
        assert int8.checkpoint == classes * (512 * itemsize + 544) + 2 ** 20
        assert none.checkpoint == classes * 512 * itemsize + 2 ** 20
        assert int8.head == same.head == none.head
        assert int8.total == same.total - rows * (512 * itemsize - 544)

    def replan(world=2, batch_size=128, bank_dtype="float16", bank_on_gpu=False, bank_momentum="same"):
        return memory_plan.plan(classes, world, 512, batch_size, 0.1, Storage(bank_dtype, bank_momentum)), None
    ways = memory_plan.ways_out(replan, 0, 12e9, 2, 128, classes, Storage("float16"), False)
    int8 = replan(bank_momentum="int8")[0]
    assert f"bank_momentum=int8, 8-bit momentum ({int8.total / 1e9:.1f} GB per worker, still over)" in ways
    assert not any("bank_dtype=float16" in way for way in ways)
    assert any(way.startswith("bank_dtype=int8 with bank_momentum=none") for way in ways)
    for stored, on_gpu, host_kernel in (("int8", False, True), ("same", True, True), ("same", False, False)):
        offered = memory_plan.ways_out(replan, 0, 12e9, 2, 128, classes, Storage("float16", stored), on_gpu,
                                       host_kernel)
        assert not any(way.startswith("bank_momentum=int8") for way in offered)
        assert any(way.startswith("bank_dtype=int8") for way in offered) == (host_kernel and not on_gpu)


def test_the_fields_mbf_at_112_px_is_not_refused_on_a_24_gb_machine(monkeypatch):
    """Test that check_memory, on a machine with 21.4 GB available (this 24 GB one, idle), takes mbf
    at 112 px with 1,000 classes on 2 workers x 64 and on 1 worker x 128 (measured peaks: 6.5 and
    11.5 GB a worker, docs/scale-and-memory.md), where the formula before MXNet's own plan refused
    both; and that 20M classes in float32 on 2 workers is still refused, in one line."""
    import mxnet as mx
    import default
    from sample_fc import symbols
    from sample_fc.run.backbone_memory import planned_graph_bytes
    monkeypatch.setattr(memory_plan, "meminfo_available", lambda: 21.4e9)
    symbol = symbols.get_symbol("mbf", 512, 112)
    for world, batch in ((2, 64), (1, 128)):
        cfg = default.config_for_run("synthetic_1m", "mbf", None, ["num_classes=1000", f"batch_size={batch}"])
        host, device = memory_plan.check_memory(cfg, world, symbol, mx.cpu(), mx.cpu(), local_size=world)
        graph = planned_graph_bytes(symbol, 112, batch)           # MXNet's own plan: most of it
        assert device is None and graph < host.backbone < host.total <= 21.4e9 / world, (world, batch, host.total)
    cfg = default.config_for_run("synthetic_1m", "mbf", None, ["num_classes=20000000"])
    with pytest.raises(UsageError, match=r"this run needs [\d.]+ GB of host memory per worker \(bank 41.0 GB") as error:
        memory_plan.check_memory(cfg, 2, symbol, mx.cpu(), mx.cpu(), local_size=2)
    assert "\n" not in str(error.value)


def test_the_peak_is_the_processs_own_not_its_parents():
    """Test that peak_rss_bytes counts this process's memory (1 GB written here shows) and that a
    child started while this process holds that 1 GB reports its own few hundred MB: ru_maxrss,
    which a vfork child inherits from its parent, would say 1 GB or more there."""
    import subprocess
    import sys
    import numpy as np
    held = np.ones(125_000_000)                                      # 1 GB, every page written
    assert memory_plan.peak_rss_bytes() >= held.nbytes
    child = subprocess.run([sys.executable, "-c", "from sample_fc.run.memory_plan import peak_rss_bytes; "
                            "print(peak_rss_bytes())"], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and int(child.stdout) < 0.5e9, child.stdout + child.stderr[-500:]
    del held

"""Tests for python -m sample_fc.tools.plan: another node's memory, the ways out and the exit
code of a run that does not fit, and the checkpoints against the free disk."""
import re

import pytest

from sample_fc import checkpoint
from sample_fc.run import memory_plan
from sample_fc.tools import plan

R100_GPU = ["--dataset", "glint360k", "--network", "r100", "-np", "8"]


def run(argv, capsys):
    code = plan.main(argv)
    return code, capsys.readouterr().out


def test_another_nodes_memory_is_not_this_machines(monkeypatch, capsys, tmp_path):
    """Test that --gpu-memory with --memory-per-node checks the host memory given (a bank on the
    GPU leaves the runtime and the loader's batches there: no verification set is found here), and
    that --gpu-memory alone does not check host memory against this machine's MemAvailable."""
    monkeypatch.setattr(memory_plan, "meminfo_available", lambda: 1)     # this machine: no memory
    root = ["--models-root", str(tmp_path)]
    code, out = run(R100_GPU + ["--gpu-memory", "80", "--memory-per-node", "512"] + root, capsys)
    host = memory_plan.RUNTIME_BYTES + memory_plan.BATCHES_IN_FLIGHT * 64 * 3 * 112 * 112 * 4    # runtime, the loader
    assert code == 0 and f"fits: {host / 1e9:.2f} GB per worker of 64.00 GB of host memory (512.0 GB shared by 8 " \
                         f"worker(s))" in out, out
    assert re.search(r"^fits: [\d.]+ GB per worker of 80.00 GB of GPU memory", out, re.M)
    code, out = run(R100_GPU + ["--gpu-memory", "80"] + root, capsys)
    assert code == 0 and "host memory: not checked (--gpu-memory describes another node" in out
    assert "does NOT fit" not in out


def test_what_does_not_fit_lists_the_ways_out_and_exits_2(capsys, tmp_path):
    """Test that a GPU plan over its memory lists train.py's ways out, each with the GB it
    gives (the smaller batch first: r100's backbone is the largest term), and exits 2."""
    code, out = run(R100_GPU + ["--gpu-memory", "10", "--memory-per-node", "512", "--models-root", str(tmp_path)],
                    capsys)
    assert code == 2 and "does NOT fit:" in out
    ways = [line.strip()[len("way out: "):] for line in out.splitlines() if line.strip().startswith("way out: ")]
    assert re.fullmatch(r"a smaller batch: batch_size=32 \([\d.]+ GB per worker\) — the backbone, [\d.]+ GB at "
                        r"batch 64, is the largest term", ways[0]), ways
    assert any(way.startswith("bank_dtype=float16, half the bank (") for way in ways), ways
    assert any(way.startswith("the bank on the host, bank_context=cpu (GPU memory ") for way in ways), ways
    assert ways[-1] == memory_plan.OTHER_WAYS
    assert not any(way.startswith("more workers") for way in ways), ways     # 8,192 GPUs would save 6%: not a way
    code, out = run(R100_GPU + ["--gpu-memory", "80", "--memory-per-node", "512", "--models-root", str(tmp_path)],
                    capsys)
    assert code == 0 and "way out" not in out


def test_a_checkpoint_larger_than_the_free_disk_is_a_warning(monkeypatch, capsys, tmp_path):
    """Test that the checkpoints are set against the free disk of the models root: a warning
    when one checkpoint does not fit, another when the kept ones do not."""
    argv = ["--dataset", "synthetic_1m", "--set", "num_classes=20000000", "-np", "2", "--memory-per-node", "1024",
            "--models-root", str(tmp_path / "run")]
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 50e9)
    code, out = run(argv, capsys)
    assert code == 0 and re.search(r"^disk: one checkpoint 8[12]\.\d\d GB, ckpt_keep=3 kept plus one being written "
                                   rf"\d+\.\d\d GB; 50\.0 GB free at {re.escape(str(tmp_path / 'run'))}$", out, re.M), out
    assert "warning: one checkpoint (81.9 GB) does not fit the 50.0 GB free at" in out
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 200e9)
    code, out = run(argv, capsys)
    assert re.search(r"^warning: ckpt_keep=3 checkpoints plus the one being written \(327\.\d GB\) do not fit the "
                     r"200\.0 GB free at ", out, re.M), out
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 1e12)
    code, out = run(argv, capsys)
    assert "warning" not in out


def test_the_plan_of_an_int8_momentum_bank_and_its_refusal_on_a_gpu(capsys, tmp_path):
    """Test that --set bank_momentum=int8 plans the bank at D + 4 ceil(D / 64) momentum bytes a row
    (a float16 bank in host memory), and that such a bank on the GPU (bank_context=same with
    --gpu-memory) is refused in one line naming the setting and the fix, exit 2."""
    argv = ["--dataset", "synthetic_1m", "-np", "2", "--memory-per-node", "1024", "--models-root", str(tmp_path),
            "--set", "bank_dtype=float16"]
    code, out = run(argv + ["--set", "bank_momentum=int8"], capsys)
    bank = float(re.search(r"^  bank \(weights \+ momentum\)\s+([\d.]+) GB", out, re.M).group(1))
    assert code == 0 and bank == round(500_000 * (2 * 512 + 512 + 32) / 1e9, 2), out
    with pytest.raises(SystemExit) as stop:
        run(R100_GPU + ["--gpu-memory", "80", "--set", "bank_momentum=int8", "--models-root", str(tmp_path)], capsys)
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in error
    assert error.startswith("python -m sample_fc.tools.plan: error: bank_momentum=int8 needs the bank in host "
                            "memory"), error
    code, out = run(R100_GPU + ["--gpu-memory", "80", "--memory-per-node", "512", "--set", "bank_momentum=int8",
                                "--set", "bank_context=cpu", "--models-root", str(tmp_path)], capsys)
    assert code == 0


def test_a_hundred_million_identities_on_one_8_gpu_node_with_8_bit_centers(capsys, tmp_path):
    """Test the issue's node (8 workers, 80 GB GPUs, 512 GB of host memory, the bank on the host):
    glint360k's recipe at 100,000,000 classes does not fit as float32 with its sampling warm-up from
    ratio 1.0, and the ways out name 8-bit centers and the warm-up started at the ratio itself, each
    with the GB it gives; with both it fits, the bank at 544 bytes a row by hand (12,500,000 rows x
    (512 + 4 x 8)), and the GPU <-> host traffic is a worker's embeddings down and their gradient
    back (2 x 64 x 512 float32), not the sampled rows."""
    node = ["-np", "8", "--workers-per-node", "8", "--memory-per-node", "512", "--gpu-memory", "80",
            "--dataset", "glint360k", "--network", "r100", "--models-root", str(tmp_path),
            "--set", "num_classes=100000000", "--set", "bank_context=cpu"]
    code, out = run(node, capsys)
    ways = [line.strip()[len("way out: "):] for line in out.splitlines() if line.strip().startswith("way out: ")]
    assert code == 2 and "does NOT fit" in out, out
    assert any(re.fullmatch(r"bank_dtype=int8 with bank_momentum=none, 8-bit centers \([\d.]+ GB per worker"
                            r"(, still over)?\)", way) for way in ways), ways
    assert any(re.fullmatch(r"no sampling warm-up: sample_ratio_warmup_start=0\.1 \(the plan holds the warm-up's "
                            r"first ratio, 1; [\d.]+ GB per worker(, still over)?\)", way) for way in ways), ways
    code, out = run(node + ["--set", "bank_dtype=int8", "--set", "bank_momentum=none",
                            "--set", "sample_ratio_warmup_start=0.1"], capsys)
    assert code == 0 and re.search(r"^fits: [\d.]+ GB per worker of 64\.00 GB of host memory", out, re.M), out
    bank = float(re.search(r"^  bank \(weights, no momentum\)\s+([\d.]+) GB", out, re.M).group(1))
    assert bank == round(12_500_000 * (512 + 4 * 8) / 1e9, 2), out
    assert re.search(r"^  bytes per identity\s+544$", out, re.M), out
    assert "class centers: plain SGD at lr / (1 - 0.9), no momentum (bank_momentum=none; a class comes back" in out
    crossing = float(re.search(r"^  GPU <-> host per step\s+([\d.]+) MB", out, re.M).group(1))
    assert crossing == round(2 * 64 * 512 * 4 / 1e6, 2), out

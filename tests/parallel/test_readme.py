"""Test that README.md's commands work as written, so the docs cannot drift from the code.

Every command in a ```bash block of README.md is listed here: either RUN (run in a fresh
working directory, with a few extra arguments that only shorten training) or NOT_RUN (with
the reason). A README command in neither list fails the first test."""
import os
import re
import sys

import pytest

from conftest import REPO, mpi_available, per_rank_tail
from sample_fc.bench.harness import run_bounded, single_thread_env

SHORT = ["--set", "max_update=4", "--set", "frequent=2"]
# README command as written -> extra arguments appended here (only to shorten training)
RUN = {
    "./horovodrun.sh": SHORT,
    ".venv/bin/horovodrun -np 2 -H localhost:2 .venv/bin/python train.py --network mbf_small":
        SHORT + ["--models-root", "models/plain"],
    "mpirun -np 2 .venv/bin/python train.py": SHORT + ["--models-root", "models/mpirun"],
    ".venv/bin/python -m sample_fc.tools.verify --model models/demo_mbf_small --bin data/demo/demo_val.bin [--baseline]": [],
    ".venv/bin/python -m sample_fc.tools.make_bin --pairs pairs.txt --out my_pairs.bin": [],
    ".venv/bin/python -m sample_fc.tools.embed --model models/demo_mbf_small --images faces/ --out emb.npy": [],
    ".venv/bin/python -m sample_fc.tools.export --model models/demo_mbf_small --onnx demo.onnx": [],
    ".venv/bin/python -m sample_fc.tools.pack --images faces/ --out data/mine/train": [],
    ".venv/bin/python -m sample_fc.tools.plan --dataset glint360k --network r100 -np 8 --gpu-memory 80": [],
    ".venv/bin/python -m sample_fc.tools.plan --dataset synthetic_1m --set num_classes=20000000 -np 2 "
    "--memory-per-node 256": [],
    ".venv/bin/python -m sample_fc.tools.demo_data --out data/demo": [],
}
NOT_RUN = {
    "scripts/test.sh": "the test suite itself",
    ".venv/bin/python -m sample_fc.tools.pack --images /data/my_faces --out /data/my_set/train":
        "a user's folder; the same tool runs on faces/ above",
    "./horovodrun.sh -np 2 --dataset custom --set rec=/data/my_set/train.rec --models-root models/my_set":
        "a user's set; tests/parallel/test_train.py trains --dataset custom on a set it packs",
    "./horovodrun.sh -np 8 --dataset emore --network r100 --loss arcface "
    "--models-root models/r100_emore --set rec=/data/emore/train.rec --set batch_size=128": "needs MS1MV2",
    "./horovodrun.sh -np 8 --dataset glint360k --network r100": "needs Glint360K and 8 workers",
    ".venv/bin/horovodrun -np 8 -H localhost:8 .venv/bin/python train.py --dataset glint360k --network r100":
        "needs Glint360K; the same line runs on the demo above",
    "mpirun -np 8 -H localhost:8 .venv/bin/python train.py --dataset glint360k --network r100":
        "needs Glint360K; the same line runs on the demo above",
    "./horovodrun.sh -np 16 -H host1:8,host2:8 --gloo --dataset glint360k --network r100":
        "two nodes; tests/parallel/test_multihost.py runs a 2-host job",
    "./horovodrun.sh -np 16 -H host1:8,host2:8 --mpi --dataset glint360k --network r100":
        "two nodes; tests/parallel/test_multihost.py runs a 2-host job",
    "scripts/bootstrap.sh --gpu": "downloads 2 GB and builds Horovod with CUDA (about 8 minutes), needs a "
        "CUDA 11 toolkit; run by hand here, README: GPUs says what it checked",
    "./horovodrun.sh --gpu -np 8 --dataset glint360k --network r100": "needs 8 GPUs and Glint360K",
    ".venv/bin/python -m sample_fc.bench [--quick] --json bench.json": "tests/test_bench.py runs --quick",
    ".venv/bin/python -m sample_fc.bench.glyphs --out data/glyphs5k":
        "needs the CJK fonts (scripts/install_glyph_fonts.sh); tests/test_glyphs.py builds a set with DejaVu",
    ".venv/bin/python -m sample_fc.tools.ijb --model models/emore_r100 --root IJB_release/IJBC --out ijbc_r100":
        "needs the IJB-C release; tests/test_ijb.py runs the tool on an IJB-format set it generates",
}


def readme_commands():
    """The commands of README.md's ```bash blocks: continuation lines joined, comments and
    repeated spaces dropped."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split("#", 1)[0].split())
            if line:
                commands.append(line)
    return commands


def test_every_readme_command_is_run_or_has_a_reason():
    """Test that the README's commands and this test's lists are the same set."""
    commands = readme_commands()
    assert sorted(set(commands)) == sorted(set(RUN) | set(NOT_RUN))


def _workspace(folder):
    """A user's working directory: the repository's scripts and venv linked in, and a folder
    of face images (faces/<identity>/*.png) with a pairs list, made from the demo's .bin."""
    for name in (".venv", "horovodrun.sh", "train.py"):
        os.symlink(REPO / name, folder / name)
    from sample_fc.data.bin_format import read_bin
    from sample_fc.tools.demo_data import make_demo
    make_demo(str(folder / "source"), num_identities=4, images_per_identity=2, num_val_identities=4,
              num_pairs=10, progress=False)
    images, issame = read_bin(str(folder / "source" / "demo_val.bin"))
    lines = []
    for pair, same in enumerate(issame):
        names = []
        for side in range(2):
            path = folder / "faces" / f"person{pair % 3}" / f"{pair}_{side}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(images[2 * pair + side])    # JPEG bytes; the name says png: decoders sniff
            names.append(str(path.relative_to(folder)))
        lines.append(f"{names[0]} {names[1]} {int(same)}")
    (folder / "pairs.txt").write_text("\n".join(lines) + "\n")


def test_readme_commands_run_as_written(tmp_path):
    """Test that each RUN command, typed in a fresh working directory in README order,
    exits 0 (training ones shortened to 4 steps), and that they leave what README says."""
    _workspace(tmp_path)
    env = single_thread_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    for command in readme_commands():
        if command not in RUN:
            continue
        if command.startswith("mpirun") and not mpi_available():
            continue
        argv = re.sub(r"\[[^\]]*\]", "", command).split() + RUN[command]   # [optional] parts left out
        result = run_bounded(argv, timeout_s=300, env=env, cwd=str(tmp_path))
        assert not result.timed_out and result.returncode == 0, f"{command}\n{per_rank_tail(result.output)}"
        print(f"README ok ({result.seconds:.0f} s): {command}", file=sys.stderr)
    assert (tmp_path / "models" / "demo_mbf_small" / "step-00000004" / "COMPLETE").is_file()
    for made in ("my_pairs.bin", "emb.npy", "emb.txt", "demo.onnx", "data/mine/train.rec", "data/mine/property"):
        assert (tmp_path / made).is_file(), made


@pytest.mark.parametrize("command", sorted(NOT_RUN))
def test_not_run_commands_parse(command):
    """Test that the README's commands this machine cannot run at least name real options:
    train.py's part parses (or the tool's --help works)."""
    if "train.py" not in command and "horovodrun.sh" not in command:
        pytest.skip("not a training command")
    words = command.split()
    start = words.index("train.py") + 1 if "train.py" in words else 1
    train_args = [w for w in words[start:]]
    if "horovodrun.sh" in command:     # its own options go to horovodrun
        skip = {"-np", "-H"}
        kept, drop = [], False
        for word in train_args:
            if drop:
                drop = False
                continue
            if word in skip:
                drop = True
                continue
            if word in ("--gloo", "--mpi", "--gpu"):
                continue
            kept.append(word)
        train_args = kept
    sys.path.insert(0, str(REPO))
    import train
    args = train.make_parser().parse_args(train_args)
    assert train.default.get_config(args.dataset, args.network, args.loss)

"""Test that the commands of README.md and the guides in docs/ work as written, so the docs
cannot drift from the code.

Every command in a ```bash block of README.md or docs/*.md is listed here: either RUN (run in
a fresh working directory, with a few extra arguments that only shorten training; a command
that stands in several pages runs once) or NOT_RUN (with the reason). A command in neither list
fails the first test; commands kept only as a record belong in ```text blocks. Also: every
guide is linked from README.md, every relative link points to a file, and the cluster examples
in docs/examples/ are valid and name real train.py options."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO, mpi_available, per_rank_tail
from bench.harness import run_bounded, single_thread_env

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
    ".venv/bin/python -m sample_fc.tools.plan -np 8 --workers-per-node 8 --memory-per-node 512 --gpu-memory 80 "
    "--dataset glint360k --network r100 --set num_classes=100000000 --set bank_context=cpu --set bank_dtype=int8 "
    "--set bank_momentum=none --set sample_ratio_warmup_start=0.1": [],
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
    ".venv/bin/python -m bench [--quick] --json bench.json": "tests/test_bench.py runs --quick",
    ".venv/bin/python -m bench.glyphs --out data/glyphs5k":
        "needs the CJK fonts (scripts/install_glyph_fonts.sh); tests/test_glyphs.py builds a set with DejaVu",
    ".venv/bin/python -m sample_fc.tools.ijb --model models/emore_r100 --root IJB_release/IJBC --out ijbc_r100":
        "needs the IJB-C release; tests/test_ijb.py runs the tool on an IJB-format set it generates",
    "./horovodrun.sh -np 2 --dataset synthetic_1m --network mbf --set num_classes=100000000 --set embedding_size=128 "
    "--set bank_dtype=int8 --set bank_momentum=none --set batch_size=16 --set sample_ratio=auto --set max_update=2 "
    "--set ckpt_period=2 --models-root models/100m":
        "100M identities: 20 GB of memory, 41 GB of checkpoints and 7 minutes (BENCHMARKS.md 'Scale' records the "
        "run); tests/parallel/test_train.py resumes and re-splits a run (two workers to one and back) at a small size",
    "./horovodrun.sh -np 2 --resume models/100m --set max_update=4": "resumes the 100M run above",
    "./horovodrun.sh -np 1 --resume models/100m --set max_update=6": "re-splits the 100M run above to one worker",
}


EXAMPLES = REPO / "docs" / "examples"


def doc_pages():
    """README.md, then the guides in docs/ by name."""
    return [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


def doc_commands():
    """The commands of the ```bash blocks of README.md and docs/*.md, in that order:
    continuation lines joined, comments and repeated spaces dropped."""
    commands = []
    for page in doc_pages():
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = " ".join(line.split("#", 1)[0].split())
                if line:
                    commands.append(line)
    return commands


def test_every_doc_command_is_run_or_has_a_reason():
    """Test that the commands of README.md and docs/*.md and this test's lists are the same set."""
    commands = set(doc_commands())
    listed = set(RUN) | set(NOT_RUN)
    assert not commands - listed, f"in the docs, in neither list: {sorted(commands - listed)}"
    assert not listed - commands, f"listed, in no doc: {sorted(listed - commands)}"
    assert not set(RUN) & set(NOT_RUN)


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
    """Test that each RUN command, typed in a fresh working directory in the docs' order
    (README.md first), exits 0 (training ones shortened to 4 steps), and that they leave what
    the docs say."""
    _workspace(tmp_path)
    env = single_thread_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    done = set()
    for command in doc_commands():
        if command not in RUN or command in done:
            continue
        done.add(command)
        if command.startswith("mpirun") and not mpi_available():
            continue
        argv = re.sub(r"\[[^\]]*\]", "", command).split() + RUN[command]   # [optional] parts left out
        result = run_bounded(argv, timeout_s=300, env=env, cwd=str(tmp_path))
        assert not result.timed_out and result.returncode == 0, f"{command}\n{per_rank_tail(result.output)}"
        if command == "./horovodrun.sh" and os.cpu_count() == 2:     # the layout measured fastest for the demo
            assert "horovodrun.sh: layout 2 workers x 1 thread" in result.output and "world size 2" in result.output
        print(f"README ok ({result.seconds:.0f} s): {command}", file=sys.stderr)
    assert (tmp_path / "models" / "demo_mbf_small" / "step-00000004" / "COMPLETE").is_file()
    for made in ("my_pairs.bin", "emb.npy", "emb.txt", "demo.onnx", "data/mine/train.rec", "data/mine/property"):
        assert (tmp_path / made).is_file(), made


def train_args(words):
    """The words of a command line that train.py gets: those after `train.py`, or after
    `horovodrun.sh` without horovodrun's own options (-np N, -H HOSTS, --gloo, --mpi, --gpu)."""
    if "train.py" in words:
        return words[words.index("train.py") + 1:]
    kept, drop = [], False
    start = next(i for i, word in enumerate(words) if word.endswith("horovodrun.sh")) + 1
    for word in words[start:]:
        if drop:
            drop = False
        elif word in ("-np", "-H"):
            drop = True
        elif word not in ("--gloo", "--mpi", "--gpu"):
            kept.append(word)
    return kept


def parses_as_training(words):
    """Parse train.py's part of a command line with train.py's own parser and build its config
    (argparse exits on an unknown option, which fails the calling test); a --resume line takes
    its config from the checkpoint: it is checked as the resume of a run begun with the same
    options (an override a resume may not change fails)."""
    sys.path.insert(0, str(REPO))
    import train
    args = train.make_parser().parse_args(train_args(words))
    if args.resume:      # resuming a run that began with the same line (as the cluster scripts do)
        begun = train.config.config_for_run(args.dataset, args.network, args.loss, args.overrides)
        train.config.config_for_run(args.dataset, args.network, args.loss, args.overrides, begun, note=None)
    else:
        assert train.config.get_config(args.dataset, args.network, args.loss)
    return args


@pytest.mark.parametrize("command", sorted(NOT_RUN))
def test_not_run_commands_parse(command):
    """Test that the docs' commands this machine cannot run at least name real options:
    train.py's part parses."""
    if "train.py" not in command and "horovodrun.sh" not in command:
        pytest.skip("not a training command")
    parses_as_training(command.split())


def test_every_guide_is_linked_from_the_readme():
    """Test that README.md links every page of docs/, so a newcomer finds each guide."""
    readme = (REPO / "README.md").read_text()
    pages = sorted((REPO / "docs").glob("*.md"))
    assert pages
    unlinked = [p.name for p in pages if not re.search(rf"\]\(docs/{re.escape(p.name)}(#[^)]*)?\)", readme)]
    assert not unlinked, f"docs pages README.md does not link: {unlinked}"


def relative_links(page):
    """The targets of the relative Markdown links `](path)` and `](path#anchor)` of a page,
    without the anchor (links to web pages and to an anchor of the page itself left out)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_relative_links_point_to_existing_files():
    """Test that every relative link of README.md, BENCHMARKS.md and docs/*.md names a file or
    folder that exists, relative to the page."""
    broken = []
    for page in doc_pages() + [REPO / "BENCHMARKS.md"]:
        links = relative_links(page)
        broken += [f"{page.relative_to(REPO)}: {t}" for t in links if not (page.parent / t).exists()]
    assert not broken, broken
    assert "docs/report-dashboard.png" in relative_links(REPO / "README.md")   # the figure stays shown


def script_line(text, program, resumed):
    """The words of the shell line of `text` that runs `program` (continuation lines joined),
    with the script's variables expanded from its assignments: NAME=value, and NAME=$(... echo
    "TEXT") as TEXT when `resumed` (the examples' RESUME: a checkpoint exists), else empty."""
    lines = text.replace("\\\n", " ").splitlines()
    values = {}
    for line in lines:
        assignment = re.match(r"\s*([A-Z_][A-Z0-9_]*)=(.*)$", line)
        if assignment:
            echoed = re.search(r'echo "([^"]*)"', assignment[2])
            values[assignment[1]] = (echoed[1] if resumed else "") if echoed else assignment[2].strip()
    runs = [line for line in lines if program in shlex.split(line, comments=True)]
    assert len(runs) == 1, f"{program} should run on one line: {runs}"
    line = runs[0]
    for _ in range(5):
        line = re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: values[m[1]], line)
    assert "$" not in line, line
    return [w for w in shlex.split(line, comments=True) if w != "&"]


def test_the_slurm_script_is_bash_that_stops_requeues_and_trains_with_real_options():
    """Test that docs/examples/slurm.sbatch passes `bash -n`, asks SLURM for SIGTERM before the
    limit and a requeue, passes the signal on and requeues after a stop (exit 143), and that
    the training command parses with train.py's parser, fresh and resumed."""
    path = EXAMPLES / "slurm.sbatch"
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = path.read_text()
    for needed in ("#SBATCH --signal=B:TERM@", "#SBATCH --requeue", "trap 'kill -TERM $PID' TERM",
                   "[[ $CODE == 143 ]] && scontrol requeue $SLURM_JOB_ID"):
        assert needed in text, needed
    fresh = parses_as_training(script_line(text, "./horovodrun.sh", resumed=False))
    resumed = parses_as_training(script_line(text, "./horovodrun.sh", resumed=True))
    assert fresh.resume is None and resumed.resume == fresh.models_root


def test_the_mpijob_is_a_kubeflow_mpijob_that_trains_with_real_options():
    """Test that docs/examples/mpijob.yaml loads as a kubeflow.org/v2beta1 MPIJob with a
    launcher and workers, that its launcher's train.py arguments parse, fresh and resumed, and
    that the pods' grace period exceeds the run's stop_grace_s."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed in this environment")
    job = yaml.safe_load((EXAMPLES / "mpijob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    specs = job["spec"]["mpiReplicaSpecs"]
    assert set(specs) == {"Launcher", "Worker"} and job["spec"]["slotsPerWorker"] >= 1
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    script = "\n".join(launcher["command"][2:] + launcher["args"])
    fresh = parses_as_training(script_line(script, "train.py", resumed=False))
    resumed = parses_as_training(script_line(script, "train.py", resumed=True))
    assert fresh.resume is None and resumed.resume == fresh.models_root
    import train
    overrides = dict(s.split("=", 1) for s in fresh.overrides)
    grace = float(overrides.get("stop_grace_s", train.config.get_config(fresh.dataset, fresh.network, fresh.loss)["stop_grace_s"]))
    for role in ("Launcher", "Worker"):
        assert specs[role]["template"]["spec"]["terminationGracePeriodSeconds"] > grace, role


@pytest.mark.parametrize("name", ["slurm.sbatch", "mpijob.yaml"])
def test_the_clusters_guide_quotes_each_example_as_it_is(name):
    """Test that docs/clusters.md shows each file of docs/examples/ word for word."""
    assert (EXAMPLES / name).read_text() in (REPO / "docs" / "clusters.md").read_text()

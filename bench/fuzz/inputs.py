"""The sound inputs the fuzz harness damages, built once in a folder (small, fast to copy):

    data/     train.rec, train.idx, property, demo_val.bin   (tools.demo_data's generator, 32 px)
    models/   a models root trained by train.py (mbf_small, 2 + 2 steps): step-00000002/ and
              step-00000004/, each a complete checkpoint (symbol, params, state.json, rank0.json,
              bank .npy/.json, optimizer.params, aux params, COMPLETE)
    mxnet/    model-symbol.json, model-0004.params: the step-4 model as a plain MXNet prefix (as the
              model zoo's), read by the tools without the checkpoint's checksums in front
    torch/    backbone.pth: the step-4 backbone as arcface_torch's state dict (hand-pickled, no torch)
    onnx/     model.onnx: tools.export of the step-4 model
    faces/    pack's input: one folder per identity, PNG and JPEG images
    ijb/IJBC  a tiny IJB-C release layout for tools.ijb (loose_crop/ and meta/)

Each group is a folder copied whole into a case, so a case reads nothing shared.
"""
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_SIZE, EMBEDDING_SIZE, CLASSES, BATCH = 32, 32, 16, 32
# train.py's settings for every run the harness starts: tiny, 2 steps, no verification pass
TRAIN_SETTINGS = ["--dataset", "demo", "--network", "mbf_small", "--set", f"embedding_size={EMBEDDING_SIZE}",
                  "--set", f"batch_size={BATCH}", "--set", "verify_period=0", "--set", "frequent=1",
                  "--set", "data_threads=1", "--set", "sample_ratio_warmup_steps=0", "--set", "max_update=2",
                  "--set", "ckpt_minutes=0"]
GROUPS = ("data", "models", "mxnet", "torch", "onnx", "faces", "ijb")


def child_env():
    """One compute thread per process; the repository importable."""
    from bench.harness import single_thread_env
    return single_thread_env({"PYTHONPATH": REPO})


def _run(argv, what, timeout_s=600):
    result = subprocess.run(argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"building the sound inputs: {what} failed ({result.returncode}):\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")


def build_data(folder):
    from sample_fc.data.demo import make_demo
    make_demo(folder, seed=1, num_identities=CLASSES, images_per_identity=4, num_val_identities=10,
              num_pairs=20, image_size=IMAGE_SIZE, progress=None)


def build_models(root, data):
    """Two checkpoints (steps 2 and 4) of one run, by train.py in a single process."""
    rec = os.path.join(data, "train.rec")
    base = [sys.executable, os.path.join(REPO, "train.py"), "--models-root", root, "--set", f"rec={rec}",
            *TRAIN_SETTINGS, "--set", "ckpt_period=2", "--set", "ckpt_keep=5"]
    _run(base, "train.py (steps 1-2)")
    _run([sys.executable, os.path.join(REPO, "train.py"), "--resume", root, "--set", "max_update=4"],
         "train.py --resume (steps 3-4)")


def _pickled_state_dict(tensors):
    """data.pkl (pickle protocol 2 opcodes, as torch.save writes it) of an OrderedDict of
    float32 tensors, storage i holding tensor i; written by hand so that torch is not needed."""
    def text(value):
        raw = value.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw

    def ints(values):
        return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"
    body = b"\x80\x02ccollections\nOrderedDict\n)R("
    for i, (name, array) in enumerate(tensors):
        strides = [int(s // array.itemsize) for s in array.strides]
        body += (text(name) + b"ctorch._utils\n_rebuild_tensor_v2\n((" + text("storage") +
                 b"ctorch\nFloatStorage\n" + text(str(i)) + text("cpu") + b"J" + struct.pack("<i", array.size) +
                 b"tQJ\x00\x00\x00\x00" + ints(array.shape) + ints(strides) +
                 b"\x89ccollections\nOrderedDict\n)RtR")
    return body + b"u."


def build_pth(path, models_root):
    """The step-4 backbone under arcface_torch's names (torch_backbone.parameter_names)."""
    import mxnet as mx
    from sample_fc.models.torch_backbone import parameter_names
    saved = mx.nd.load(os.path.join(models_root, "step-00000004", "model-0004.params"))
    params = {name[4:]: value.asnumpy() for name, value in saved.items()}
    tensors = []
    for ours, theirs, kind in parameter_names("mbf_small"):
        array = np.ascontiguousarray(params[ours], dtype=np.float32)
        tensors.append((theirs, array.reshape(-1) if kind == "prelu" else array))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("backbone/data.pkl", _pickled_state_dict(tensors))
        archive.writestr("backbone/byteorder", "little")
        for i, (_, array) in enumerate(tensors):
            archive.writestr(f"backbone/data/{i}", array.astype("<f4").tobytes())
        archive.writestr("backbone/version", "3\n")


def build_faces(folder, identities=3, per_identity=3, seed=0):
    from PIL import Image
    rng = np.random.default_rng(seed)
    for identity in range(identities):
        os.makedirs(os.path.join(folder, f"id{identity}"), exist_ok=True)
        for k in range(per_identity):
            grid = rng.integers(0, 256, (4, 4, 3)).astype(np.uint8)
            image = Image.fromarray(grid).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
            image.save(os.path.join(folder, f"id{identity}", f"{k}." + ("png" if k % 2 == 0 else "jpg")))


def build_ijb(root, seed=0):
    """An IJB-C layout: 4 identities x 2 templates x 2 faces (32 px faces in 80 px crops)."""
    from PIL import Image
    from sample_fc.tools.ijb import TEMPLATE_112
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "loose_crop"))
    os.makedirs(os.path.join(root, "meta"))
    rows, template = [], 0
    for identity in range(4):
        for _ in range(2):
            template += 1
            for media in range(2):
                crop = np.full((80, 80, 3), 128, np.uint8)
                crop[8:72, 8:72] = rng.integers(0, 256, (4, 4, 3)).repeat(16, 0).repeat(16, 1)
                name = f"{len(rows)}.png"
                Image.fromarray(crop).save(os.path.join(root, "loose_crop", name))
                points = 2 * TEMPLATE_112 * IMAGE_SIZE / 112 + 8.5
                rows.append((name, template, 100 * template + media, identity, points))
    with open(os.path.join(root, "meta", "ijbc_name_5pts_score.txt"), "w") as handle:
        for name, _, _, _, points in rows:
            handle.write(" ".join([name] + [f"{v:.4f}" for v in points.ravel()] + ["0.9000"]) + "\n")
    with open(os.path.join(root, "meta", "ijbc_face_tid_mid.txt"), "w") as handle:
        handle.writelines(f"{name} {t} {m}\n" for name, t, m, _, _ in rows)
    owner = {t: identity for _, t, _, identity, _ in rows}
    with open(os.path.join(root, "meta", "ijbc_template_pair_label.txt"), "w") as handle:
        for first in range(1, template + 1):
            for second in range(first + 1, template + 1):
                handle.write(f"{first} {second} {int(owner[first] == owner[second])}\n")


def build_inputs(folder, log=print):
    """Every group of the module docstring under `folder` (skipped when already there: the
    long run and the tests can share one build). Returns `folder`."""
    done = os.path.join(folder, "BUILT")
    if os.path.isfile(done):
        return folder
    path = {group: os.path.join(folder, group) for group in GROUPS}
    log(f"fuzz: building the sound inputs in {folder}")
    build_data(path["data"])
    build_models(path["models"], path["data"])
    os.makedirs(path["mxnet"], exist_ok=True)
    for name in ("model-symbol.json", "model-0004.params"):
        shutil.copy(os.path.join(path["models"], "step-00000004", name), path["mxnet"])
    os.makedirs(path["torch"], exist_ok=True)
    build_pth(os.path.join(path["torch"], "backbone.pth"), path["models"])
    os.makedirs(path["onnx"], exist_ok=True)
    _run([sys.executable, "-m", "sample_fc.tools.export", "--model", path["models"], "--onnx",
          os.path.join(path["onnx"], "model.onnx"), "--check-batches", "1"], "tools.export")
    build_faces(path["faces"])
    build_ijb(os.path.join(path["ijb"], "IJBC"))
    with open(done, "w") as handle:
        handle.write("ok\n")
    return folder


def old_checkpoint_inputs(inputs, folder):
    """A copy of the built `inputs` in `folder` (made once) whose checkpoints are as runs saved
    them before checksums: each COMPLETE only {"step": N}, so nothing is verified by checksum and
    every file is read as those checkpoints are. Returns `folder`."""
    done = os.path.join(folder, "BUILT")
    if os.path.isfile(done):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(inputs, folder, ignore=shutil.ignore_patterns("BUILT"))     # BUILT written last
    models = os.path.join(folder, "models")
    for name in sorted(os.listdir(models)):
        complete = os.path.join(models, name, "COMPLETE")
        if name.startswith("step-") and os.path.isfile(complete):
            with open(complete, "w") as handle:
                handle.write(f'{{"step": {int(name[len("step-"):])}}}\n')
    with open(done, "w") as handle:
        handle.write("ok\n")
    return folder

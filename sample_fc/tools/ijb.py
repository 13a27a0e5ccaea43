"""IJB-B / IJB-C 1:1 verification (template to template), as the field reports it.

    python -m sample_fc.tools.ijb --model models/emore_r100 --root IJB_release/IJBC --out ijbc_r100

--root is one target of the IJB release as insightface distributes it (IJB_release/IJBB or
IJB_release/IJBC); the target's name (ijbb or ijbc) is that folder's, or --target:

    loose_crop/                          the face crops (any image format)
    meta/<target>_name_5pts_score.txt    NAME x1 y1 ... x5 y5 SCORE: 5 landmarks (eyes, nose,
                                         mouth corners; pixels of the crop) and the detector's
                                         faceness score, one line per face
    meta/<target>_face_tid_mid.txt       NAME TEMPLATE MEDIA: the same faces in the same order
    meta/<target>_template_pair_label.txt  TEMPLATE TEMPLATE LABEL (1 genuine, 0 impostor)

Each face is aligned to the model's input (a similarity transform of its landmarks onto the
standard 112x112 five-point template, scaled to the input size) and embedded with its mirror
(summed). A template's feature, the standard way (insightface's IJB evaluation): each face's
embedding times its faceness score (--no-detector-score: not), averaged over the faces of one
media (video or still), summed over the template's media, L2-normalised. A pair's score is
the cosine of its two templates; TAR at FAR 1e-6 ... 1e-1 is read off the scores (the
largest threshold whose FAR is at most the target, as sample_fc.verification does). A FAR
below 1 / (impostor pairs) cannot be measured on the set: it is printed n/a (null in
result.json, which also gives impostor_pairs and smallest_far). A folder not named after its
target (meta/ holding ijbc_* files in a folder named otherwise) is named with the --target to add.

Writes to --out: result.json (TAR@FAR, counts, the model), roc.png (TAR against FAR, log
scale), scores.npy (one score per pair, in the pair list's order) and cache/ (the face
embeddings in chunks: an interrupted run goes on from the last complete chunk, a rerun with
the same model, faces and flip reuses them and says how many). The model is
anything the other tools take (--model, --output, --normalize).
"""
import hashlib
import json
import os
import sys

import numpy as np

from ..data.alignment import TEMPLATE_112, align, similarity_transform  # noqa: F401 (also ijb's names)
from ..data.images import open_image
from ..errors import UsageError
from ..verification import Embedder, tar_at_far, to_nchw
from .cli import Progress, check_output_dir, make_parser, run_or_exit
from .model_io import add_model_arguments, batch_size_or_default, load_model_from_args
from .plots import roc_figure, roc_points

FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
CHUNK = 2048                       # faces per cache file


def _read_rows(path, columns, parse, what):
    """Rows of a whitespace-separated metadata file, each parse(fields); UsageError naming the
    file and line for a missing file or a line that does not parse."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file (expected {what})")
    rows = []
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                continue
            try:
                if len(fields) != columns:
                    raise ValueError(f"{len(fields)} fields")
                rows.append(parse(fields))
            except ValueError as err:
                raise UsageError(f"{path}:{number}: expected {what}, got {line.strip()[:80]!r} ({err})") from None
    if not rows:
        raise UsageError(f"{path}: empty (expected {what})")
    return rows


def read_release(root, target):
    """dict(names, landmarks (N, 5, 2), scores (N,), templates (N,), medias (N,), pairs (P, 2),
    labels (P,)) of an IJB release folder; UsageError naming a missing or damaged file, a face
    listed differently in the two face files, a pair naming an unknown template, or a crop
    that is missing."""
    meta = os.path.join(root, "meta")
    faces = _read_rows(os.path.join(meta, f"{target}_name_5pts_score.txt"), 12,
                       lambda f: (f[0], [float(v) for v in f[1:11]], float(f[11])),
                       "NAME x1 y1 ... x5 y5 SCORE")
    groups = _read_rows(os.path.join(meta, f"{target}_face_tid_mid.txt"), 3,
                        lambda f: (f[0], int(f[1]), int(f[2])), "NAME TEMPLATE MEDIA")
    pairs = _read_rows(os.path.join(meta, f"{target}_template_pair_label.txt"), 3,
                       lambda f: (int(f[0]), int(f[1]), _label(f[2])), "TEMPLATE TEMPLATE LABEL (0 or 1)")
    if len(faces) != len(groups) or any(a[0] != b[0] for a, b in zip(faces, groups)):
        index = next((i for i, (a, b) in enumerate(zip(faces, groups)) if a[0] != b[0]), min(len(faces), len(groups)))
        raise UsageError(f"{meta}: the face lists differ at face {index + 1} ({len(faces)} faces with landmarks, "
                         f"{len(groups)} with templates); they must list the same faces in the same order")
    templates = np.array([g[1] for g in groups])
    pair_array = np.array([p[:2] for p in pairs])
    unknown = sorted(set(pair_array.ravel()) - set(templates))
    if unknown:
        raise UsageError(f"{target}_template_pair_label.txt names {len(unknown)} templates no face belongs to "
                         f"(e.g. {unknown[0]})")
    names = [f[0] for f in faces]
    missing = [n for n in names if not os.path.isfile(os.path.join(root, "loose_crop", n))]
    if missing:
        raise UsageError(f"{os.path.join(root, 'loose_crop', missing[0])}: no such file ({len(missing)} of "
                         f"{len(names)} crops missing)")
    return dict(names=names, landmarks=np.array([f[1] for f in faces]).reshape(-1, 5, 2),
                scores=np.array([f[2] for f in faces]), templates=templates,
                medias=np.array([g[2] for g in groups]), pairs=pair_array, labels=np.array([p[2] for p in pairs]))


def _label(text):
    if text not in ("0", "1"):
        raise ValueError("a label is 0 or 1")
    return int(text)


def template_features(embeddings, scores, templates, medias, use_scores=True):
    """(template ids sorted, (T, D) L2-normalised template features): face embeddings times
    their faceness scores (if use_scores), averaged within a media of a template, summed over
    the template's media."""
    weighted = embeddings * (scores[:, None] if use_scores else 1.0)
    ids = np.unique(templates)
    features = np.zeros((len(ids), embeddings.shape[1]))
    for row, template in enumerate(ids):
        members = templates == template
        for media in np.unique(medias[members]):
            features[row] += weighted[members & (medias == media)].mean(axis=0)
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return ids, features / np.maximum(norms, 1e-12)


def pair_scores(ids, features, pairs):
    """Cosine of each pair's two template features."""
    position = {template: row for row, template in enumerate(ids)}
    first = features[[position[t] for t in pairs[:, 0]]]
    second = features[[position[t] for t in pairs[:, 1]]]
    return np.sum(first * second, axis=1)


def tar_table(scores, labels, fars=FARS):
    """{far: TAR} for each FAR (a pair is accepted when its score exceeds the threshold); None
    for a FAR below 1 / (impostor pairs), which this set cannot measure (not one impostor may
    be accepted there, whatever the threshold)."""
    impostors = int(np.sum(np.asarray(labels) != 1))
    return {far: tar_at_far(-np.asarray(scores, float), np.asarray(labels) == 1, far) if far * impostors >= 1
            else None for far in fars}


def _read_json_or_none(path):
    """The JSON in `path`, or None when it is missing or unreadable (an interrupted write)."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


class EmbeddingCache:
    """Face embeddings in chunk files under `folder`, for one (model, faces, input) key: chunks
    of another key are not used (the folder is emptied of them first)."""

    def __init__(self, folder, key):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        key_file = os.path.join(folder, "key.json")
        if _read_json_or_none(key_file) != key:
            for name in os.listdir(folder):
                if name.startswith("chunk-"):
                    os.remove(os.path.join(folder, name))
            with open(key_file + ".tmp", "w") as handle:
                json.dump(key, handle)
            os.replace(key_file + ".tmp", key_file)

    def path(self, index):
        return os.path.join(self.folder, f"chunk-{index:06d}.npy")

    def get(self, index):
        try:
            return np.load(self.path(index))
        except (OSError, ValueError):
            return None

    def put(self, index, rows):
        temporary = self.path(index) + ".tmp.npy"
        np.save(temporary, rows)
        os.replace(temporary, self.path(index))


def cache_key(model, release, flip):
    """What the cached embeddings depend on: the model's files, input and output, the faces
    and their landmarks, flip."""
    params = model.params_file
    digest = hashlib.sha256()
    digest.update("\n".join(release["names"]).encode())
    digest.update(np.ascontiguousarray(release["landmarks"]).tobytes())
    return {"params": os.path.abspath(params), "size": os.path.getsize(params), "mtime": os.path.getmtime(params),
            "output": model.output, "input": model.input_note, "image_size": model.image_size,
            "flip": flip, "faces": digest.hexdigest()}


def embed_faces(model, release, root, cache, batch_size, ctx, flip=True, progress=True):
    """((N, D) flip-summed embeddings of the aligned faces, how many came from the cache),
    chunk by chunk through the cache; UsageError naming a crop that cannot be read."""
    names, landmarks = release["names"], release["landmarks"]
    embedder = None
    rows, reused = [], 0
    bar = Progress(len(names), "embedding faces", enabled=progress)
    for index, start in enumerate(range(0, len(names), CHUNK)):
        chunk = cache.get(index)
        stop = min(start + CHUNK, len(names))
        if chunk is None or len(chunk) != stop - start:
            embedder = embedder or Embedder(model.symbol, model.arg_params, model.aux_params, ctx,
                                            model.image_size, batch_size=batch_size, flip=flip)
            faces = []
            for i in range(start, stop):
                path = os.path.join(root, "loose_crop", names[i])
                try:
                    faces.append(align(open_image(path), landmarks[i], model.image_size))
                except OSError as err:     # unreadable or not an image
                    raise UsageError(f"{path}: {err}") from None
            chunk = embedder(to_nchw(np.stack(faces))).astype(np.float32)
            cache.put(index, chunk)
        else:
            reused += len(chunk)
        rows.append(chunk)
        bar.update(stop - start)
    return np.concatenate(rows), reused


def resolve_target(root, given):
    """The release's target name: --target, else the --root folder's name; UsageError suggesting
    --target when that folder's meta/ holds the files of another target name."""
    target = (given or os.path.basename(os.path.normpath(root))).lower()
    meta = os.path.join(root, "meta")
    suffix = "_name_5pts_score.txt"
    if given or os.path.isfile(os.path.join(meta, target + suffix)) or not os.path.isdir(meta):
        return target
    found = sorted(name[:-len(suffix)] for name in os.listdir(meta) if name.endswith(suffix))
    if found:
        raise UsageError(f"--root {root} is named {target!r}, but its meta/ holds the files of "
                         f"{' and '.join(found)} ({found[0]}{suffix}): add --target {found[0]}")
    return target


def main(argv=None):
    parser = make_parser("sample_fc.tools.ijb", __doc__)
    add_model_arguments(parser)
    parser.add_argument("--root", required=True, metavar="DIR", help="an IJB target folder (IJB_release/IJBC)")
    parser.add_argument("--target", default=None, help="ijbb or ijbc; default: the --root folder's name")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for result.json, roc.png, scores.npy, cache/")
    parser.add_argument("--no-flip", dest="flip", action="store_false", help="embed each face alone")
    parser.add_argument("--no-detector-score", dest="detector_score", action="store_false",
                        help="do not weight faces by the detector's faceness score")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = parser.parse_args(argv)

    def work():
        target = resolve_target(args.root, args.target)
        check_output_dir(args.out, "--out")
        release = read_release(args.root, target)
        model = load_model_from_args(args)
        print(model.line(), flush=True)
        print(f"{target}: {len(release['names'])} faces, {len(np.unique(release['templates']))} templates, "
              f"{len(release['pairs'])} pairs ({int(release['labels'].sum())} genuine)", flush=True)
        batch_size = batch_size_or_default(args.batch_size, model)
        cache = EmbeddingCache(os.path.join(args.out, "cache"), cache_key(model, release, args.flip))
        embeddings, reused = embed_faces(model, release, args.root, cache, batch_size, args.context, args.flip,
                                         args.progress)
        if reused:
            print(f"reused {reused} of {len(embeddings)} face embeddings from {cache.folder} (the same model, "
                  f"faces and flip; delete that folder to embed them again)", flush=True)
        ids, features = template_features(embeddings, release["scores"], release["templates"], release["medias"],
                                          args.detector_score)
        scores = pair_scores(ids, features, release["pairs"])
        table = tar_table(scores, release["labels"])
        np.save(os.path.join(args.out, "scores.npy"), scores)
        far, tar = roc_points(scores, release["labels"])
        roc_figure(os.path.join(args.out, "roc.png"), [(target.upper(), far, tar)],
                   f"{target.upper()} 1:1, {model.prefix}", points=list(table.items()))
        impostors = int(len(scores) - release["labels"].sum())
        result = {"target": target, "model": model.params_file, "output": model.output,
                  "faces": len(release["names"]), "templates": int(len(ids)), "pairs": int(len(scores)),
                  "genuine_pairs": int(release["labels"].sum()), "impostor_pairs": impostors,
                  "smallest_far": 1.0 / impostors, "flip": args.flip,
                  "detector_score": args.detector_score, "tar_at_far": {f"{far:g}": tar for far, tar in table.items()}}
        with open(os.path.join(args.out, "result.json"), "w") as handle:
            json.dump(result, handle, indent=2)
        return table, impostors

    table, impostors = run_or_exit(parser, work)
    print("FAR  " + "  ".join(f"{far:>7g}" for far in table))
    print("TAR  " + "  ".join(f"{100 * tar:6.2f}%" if tar is not None else f"{'n/a':>7}" for tar in table.values()))
    if None in table.values():
        print(f"n/a: a FAR below 1/{impostors} (the impostor pairs) cannot be measured on this set; "
              f"result.json has null there")
    print(f"wrote {os.path.join(args.out, 'result.json')}, roc.png, scores.npy")
    return 0


if __name__ == "__main__":
    sys.exit(main())

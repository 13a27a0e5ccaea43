"""A synthetic face-like dataset for demos: train.rec/.idx/property + an open-set demo_val.bin.

    python -m sample_fc.tools.demo_data --out DIR [--seed 0] [--num-identities 200] ...   (the tool)
    make_demo(out_dir, ...), ensure_demo(out_dir)                                         (here)

Each identity is a procedural face template (skin tone and texture, face shape and jaw,
hair colour and style, eyes, brows, nose, mouth, optional glasses / beard / moles / blush).
Each image is a view of it: shift, scale, rotation, a small head turn, expression (smile,
blink, raised brows), background, lighting direction and colour cast, contrast, edge
softness (blur), noise and sometimes an occluding patch. Verification pairs use identities
held out of training (a separate random stream), half same-identity pairs of two different
views and half different-identity pairs. Same seed and parameters -> byte-identical files.
"""
import os

import numpy as np

from ..errors import UsageError
from .bin_format import load_bin, write_bin
from .images import encode_jpeg
from .recordio import RecordWriter
from ..verification import MIN_PAIRS        # demo_val.bin must be scorable

TRAIN, VAL, PAIRS = 0, 1, 2  # random streams: (seed, stream, identity, 0=template/1=views)
SKIN_DARK, SKIN_LIGHT = np.array([90, 56, 40.0]), np.array([240, 205, 180.0])
HAIR = np.array([[20, 16, 14], [60, 40, 25], [110, 75, 40], [200, 165, 100], [150, 60, 25],
                 [165, 165, 165], [235, 230, 220], [40, 60, 120]], dtype=float)
IRIS = np.array([[70, 45, 25], [40, 90, 160], [60, 120, 70], [90, 90, 100], [25, 20, 20]], dtype=float)


def identity_template(seed, stream, index):
    """The fixed look of identity `index` of `stream` (TRAIN or VAL): a dict of numbers."""
    rng = np.random.default_rng((seed, stream, index, 0))
    u = rng.uniform
    # lengths are in template units: the image spans [-1, 1] at view scale 1, y points down
    t = {"skin": SKIN_DARK + (SKIN_LIGHT - SKIN_DARK) * u() + u(-18, 18, 3),
         "hair": HAIR[rng.integers(len(HAIR))] + u(-20, 20, 3),
         "iris": IRIS[rng.integers(len(IRIS))] + u(-15, 15, 3),
         "cy": u(0.0, 0.1), "face_a": u(0.5, 0.66), "face_b": u(0.68, 0.82), "jaw": u(0.0, 0.35),
         "hair_scale": u(1.03, 1.18), "hair_len": u(-0.3, 0.8), "hairline": u(0.35, 0.75),
         "wave": (u(0, 0.08), u(3, 9), u(0, 2 * np.pi)), "ear_y": u(-0.1, 0.05), "ear_r": u(0.08, 0.13),
         "eye_y": u(-0.24, -0.1), "eye_dx": u(0.2, 0.3), "eye_rx": u(0.08, 0.13), "eye_ratio": u(0.4, 0.65),
         "iris_r": u(0.35, 0.5), "brow_gap": u(0.04, 0.1), "brow_w": u(1.0, 1.5), "brow_t": u(0.02, 0.05),
         "brow_tilt": u(-0.35, 0.35), "nose_y": u(0.04, 0.16), "nose_len": u(0.15, 0.3),
         "nose_w": u(0.05, 0.1), "mouth_y": u(0.3, 0.42), "mouth_w": u(0.13, 0.26), "mouth_t": u(0.03, 0.06),
         "smile": u(-0.6, 1.2), "lip": u(0.5, 0.8), "glasses": rng.random() < 0.25, "frame": u(0, 120, 3),
         "beard": rng.random() < 0.2, "blush": (u(0, 0.35), u(-0.35, 0.35), u(-0.05, 0.3), u(0.08, 0.18)),
         "texture": (u(2, 9), u(2, 9), u(0, 6.3), u(0, 0.1))}
    t["moles"] = u(-1, 1, (rng.integers(0, 4), 2)) * [0.4, 0.45] + [0, t["cy"]]
    return t


def draw_views(rng, n):
    """Random view parameters for n images: a dict of arrays with first dimension n."""
    u = rng.uniform
    return {"scale": u(0.95, 1.25, n), "angle": np.clip(rng.normal(0, 0.17, n), -0.35, 0.35),
            "tx": u(-0.12, 0.12, n), "ty": u(-0.12, 0.12, n), "yaw": u(-1, 1, n),
            "smile": rng.normal(0, 0.4, n), "blink": u(0.45, 1.1, n), "brow_raise": rng.normal(0, 0.02, n),
            "mouth_open": u(0, 1, n) ** 2,
            "bg": u(0, 255, (2, n, 3)), "bg_angle": u(0, 2 * np.pi, n), "bright": u(0.7, 1.3, n),
            "gains": u(0.85, 1.15, (n, 3)), "light": u(0, 0.5, n), "light_angle": u(0, 2 * np.pi, n),
            "contrast": u(0.75, 1.2, n), "soft": u(0.6, 2.0, n), "noise": u(2, 10, n),
            "occlude": rng.random(n) < 0.35, "occ_box": u(0, 1, (n, 4)), "occ_color": u(0, 255, (n, 3)),
            "noise_seed": int(rng.integers(2 ** 62))}


def _col(x):
    """Per-view values (n,) -> (n, 1, 1) for broadcasting over pixels; scalars unchanged."""
    return np.asarray(x, dtype=np.float32).reshape(-1, 1, 1) if np.ndim(x) else np.float32(x)


def _unit(x):
    """Clip to [0, 1] in place (two ufunc passes; np.clip is slow on numpy 1.23)."""
    np.maximum(x, 0, out=x)
    return np.minimum(x, 1, out=x)


class _Canvas:
    """n views being painted: template coordinates X, Y of every pixel and the RGB images."""

    def __init__(self, views, size):
        self.v, self.size, self.n = views, size, len(views["scale"])
        grid = ((np.arange(size, dtype=np.float32) + 0.5) * (2.0 / size) - 1.0)
        self.U, self.V = grid[None, None, :], grid[None, :, None]  # image coordinates in [-1, 1]
        cos, sin, s = _col(np.cos(views["angle"])), _col(np.sin(views["angle"])), _col(views["scale"])
        du, dv = self.U - _col(views["tx"]), self.V - _col(views["ty"])
        self.X, self.Y = (cos * du + sin * dv) / s, (cos * dv - sin * du) / s  # inverse similarity
        self.soft = _col(views["soft"] * (2.0 / size) / views["scale"])  # edge ramp in template units
        bg_cos, bg_sin = _col(np.cos(views["bg_angle"])), _col(np.sin(views["bg_angle"]))
        ramp = _unit(0.5 + 0.5 * (bg_cos * self.U + bg_sin * self.V))
        bg0, bg1 = views["bg"][0][:, :, None, None], views["bg"][1][:, :, None, None]
        self.img = bg0 + (bg1 - bg0) * ramp[:, None]  # (n, 3, H, W): channels first, fast broadcasting

    def edge(self, inside):
        """Soft coverage from a signed distance in template units (positive inside)."""
        return _unit(0.5 + inside / self.soft)

    def ellipse(self, X, Y, cx, cy, a, b, angle=0.0):
        """Soft coverage of an ellipse (semi-axes a, b, rotated by angle) at template points X, Y."""
        dx, dy = X - cx, Y - cy
        if angle:
            c, s = np.cos(angle), np.sin(angle)
            dx, dy = c * dx + s * dy, c * dy - s * dx
        return self.edge((1 - (dx / a) ** 2 - (dy / b) ** 2) * (0.5 * np.minimum(a, b)))

    def paint(self, color, mask_fn, center=None, radius=None, alpha=1.0):
        """Blend `color` over coverage mask_fn(X, Y); with a center and radius (template units),
        only inside the union over views of the image box of that disc. Returns the mask."""
        rows = cols = slice(None)
        if radius is not None:
            v, s = self.v, self.v["scale"]
            cx, cy = np.broadcast_to(center[0], (self.n,)), np.broadcast_to(center[1], (self.n,))
            ix = s * (np.cos(v["angle"]) * cx - np.sin(v["angle"]) * cy) + v["tx"]
            iy = s * (np.sin(v["angle"]) * cx + np.cos(v["angle"]) * cy) + v["ty"]
            px = lambda lo, hi: slice(min(max(int((lo + 1) * self.size / 2), 0), self.size),
                                      min(max(int((hi + 1) * self.size / 2) + 1, 0), self.size))
            cols = px(np.min(ix - s * radius), np.max(ix + s * radius))
            rows = px(np.min(iy - s * radius), np.max(iy + s * radius))
        X, Y = self.X[:, rows, cols], self.Y[:, rows, cols]
        mask = mask_fn(X, Y)
        if alpha != 1.0:
            mask = mask * alpha
        sub = self.img[:, :, rows, cols]
        color = color(X, Y) if callable(color) else np.asarray(color, dtype=np.float32).reshape(-1, 3, 1, 1)
        diff = color - sub
        diff *= mask[:, None]
        sub += diff
        return mask


def render_views(t, views, size):
    """Render template t under each view: (n, size, size, 3) uint8 RGB."""
    as32 = lambda d: {k: x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype == np.float64 else x
                      for k, x in d.items()}
    t, v = as32(t), as32(views)
    c = _Canvas(v, size)
    cy, fa, fb, yaw, yaw_n = t["cy"], t["face_a"], t["face_b"], _col(v["yaw"]), v["yaw"]
    # head: hair behind, ears, skin with a faint identity texture, blush, moles, fringe, beard
    hs = t["hair_scale"]
    c.paint(t["hair"],
            lambda X, Y: c.ellipse(X, Y, 0, cy - 0.05, fa * hs, fb * hs) * c.edge(cy + t["hair_len"] - Y))
    ear_y, ear_r = cy + t["ear_y"], t["ear_r"]
    for side in (-1, 1):
        c.paint(t["skin"] * 0.9, lambda X, Y: c.ellipse(X, Y, side * fa, ear_y, ear_r, 1.5 * ear_r),
                (side * fa, ear_y), 1.6 * ear_r)
    fx, fy, phase, amp = t["texture"]
    skin = lambda X, Y: t["skin"][:, None, None] * (1 + amp * np.sin(fx * X + fy * Y + phase))[:, None]
    face = c.paint(skin,
                   lambda X, Y: c.ellipse(X, Y, 0, cy, fa * (1 - t["jaw"] * _unit((Y - cy) / fb)), fb))
    alpha, bx, by, br = t["blush"]
    c.paint((200, 70, 70), lambda X, Y: c.ellipse(X, Y, bx, cy + by, br, 0.7 * br), (bx, cy + by), br, alpha)
    for mole_x, mole_y in t["moles"]:
        c.paint((60, 35, 25), lambda X, Y: c.ellipse(X, Y, mole_x, mole_y, 0.02, 0.02),
                (mole_x, mole_y), 0.03)
    amp_w, freq_w, phase_w = t["wave"]
    hairline = cy - t["hairline"] * fb
    c.paint(t["hair"], lambda X, Y: face * c.edge(hairline + amp_w * np.sin(freq_w * X + phase_w) - Y))
    if t["beard"]:
        c.paint(t["hair"] * 0.9, lambda X, Y: face * c.edge(Y - cy - t["nose_y"] - 0.06), alpha=0.85)
    # eyes (sclera, iris, pupil), brows and glasses; features shift sideways with the head turn
    ey, rx, ry = cy + t["eye_y"], t["eye_rx"], t["eye_rx"] * t["eye_ratio"] * _col(v["blink"])
    iris_r = rx * t["iris_r"]
    for side in (-1, 1):
        ex, box = side * t["eye_dx"] + 0.06 * yaw, (side * t["eye_dx"] + 0.06 * yaw_n, ey)
        sclera = c.paint((235, 235, 228), lambda X, Y: c.ellipse(X, Y, ex, ey, rx, ry), box, 1.1 * rx)
        inside = _unit(2 * sclera)
        c.paint(t["iris"], lambda X, Y: c.ellipse(X, Y, ex, ey, iris_r, iris_r) * inside, box, 1.1 * rx)
        pupil_r = 0.4 * iris_r
        c.paint((10, 10, 10), lambda X, Y: c.ellipse(X, Y, ex, ey, pupil_r, pupil_r) * inside, box, 1.1 * rx)
        brow_y0 = ey - rx * t["eye_ratio"] - t["brow_gap"]
        brow_y, brow_w = brow_y0 - _col(v["brow_raise"]), rx * t["brow_w"]
        c.paint(t["hair"] * 0.85,
                lambda X, Y: c.ellipse(X, Y, ex, brow_y, brow_w, t["brow_t"], side * t["brow_tilt"]),
                (box[0], brow_y0), brow_w + 0.06)
        if t["glasses"]:
            c.paint(t["frame"], lambda X, Y: _unit(c.ellipse(X, Y, ex, ey, 1.6 * rx, 1.25 * rx)
                                                   - c.ellipse(X, Y, ex, ey, 1.45 * rx, 1.1 * rx)),
                    box, 1.7 * rx)
    if t["glasses"]:
        bridge = t["eye_dx"] - 1.5 * rx
        c.paint(t["frame"], lambda X, Y: c.ellipse(X, Y, 0.06 * yaw, ey - 0.02, bridge, 0.015),
                (0.06 * yaw_n, ey), t["eye_dx"])
    # nose shadow and nostrils, mouth bent by the smile and opened by the view
    ny, nl, nw = cy + t["nose_y"], t["nose_len"], t["nose_w"]
    c.paint(t["skin"] * 0.75, lambda X, Y: c.ellipse(X, Y, 0.09 * yaw, ny - nl / 2, nw / 2, nl / 2),
            (0.09 * yaw_n, ny - nl / 2), nl / 2 + 0.02, 0.5)
    for side in (-1, 1):
        c.paint(t["skin"] * 0.45,
                lambda X, Y: c.ellipse(X, Y, side * 0.6 * nw + 0.1 * yaw, ny, 0.35 * nw, 0.2 * nw),
                (side * 0.6 * nw + 0.1 * yaw_n, ny), 0.4 * nw + 0.02)
    mouth_x, mouth_y, mw = 0.08 * yaw, cy + t["mouth_y"], t["mouth_w"]
    bent = lambda X, Y: Y + (t["smile"] + _col(v["smile"])) * (X - mouth_x) ** 2 / mw
    mouth_t = t["mouth_t"] * (1 + _col(v["mouth_open"]))
    box = (0.08 * yaw_n, mouth_y)
    c.paint(t["skin"] * t["lip"] + [40, 0, 0],
            lambda X, Y: c.ellipse(X, bent(X, Y), mouth_x, mouth_y, mw, mouth_t), box, 1.2 * mw)
    c.paint((60, 20, 20),
            lambda X, Y: c.ellipse(X, bent(X, Y), mouth_x, mouth_y, 0.9 * mw, 0.2 * mouth_t), box, 1.2 * mw)
    return _finish(c, v, size)


def _finish(c, v, size):
    """Occlusion, lighting, colour cast, contrast and noise on the painted views -> uint8."""
    for i in np.nonzero(v["occlude"])[0]:
        x0, y0, w, h = v["occ_box"][i]
        w, h = int((0.2 + 0.3 * w) * size), int((0.2 + 0.3 * h) * size)
        x0, y0 = int(x0 * (size - w)), int(y0 * (size - h))
        c.img[i, :, y0:y0 + h, x0:x0 + w] = v["occ_color"][i][:, None, None]
    # pixel * light(direction) * per-channel gain * contrast, recentred on 128, plus grey noise
    light = _col(v["bright"]) * (1 + _col(v["light"]) * (_col(np.cos(v["light_angle"])) * c.U
                                                          + _col(np.sin(v["light_angle"])) * c.V))
    contrast = v["contrast"][:, None, None, None]
    img = c.img
    img *= light[:, None]
    img *= v["gains"][:, :, None, None] * contrast
    noise = np.random.default_rng(v["noise_seed"]).standard_normal(light.shape, dtype=np.float32)
    img += (noise * _col(v["noise"]) + (128 * (1 - contrast[:, 0]) + 0.5))[:, None]  # +0.5: rounds
    np.maximum(img, 0, out=img)
    np.minimum(img, 255, out=img)
    return np.ascontiguousarray(img.astype(np.uint8).transpose(0, 2, 3, 1))


def verification_pairs(rng, num_identities, num_pairs):
    """(slots, issame) of num_pairs pairs over identities 0..num_identities-1, in random order:
    slots (2 * num_pairs,) the identity of each image (pair i: slots 2i and 2i+1), issame
    (num_pairs,) bool; half the pairs are one identity twice, half two different ones."""
    num_same = num_pairs // 2
    same = np.repeat(rng.integers(num_identities, size=num_same)[:, None], 2, axis=1)
    first = rng.integers(num_identities, size=num_pairs - num_same)
    second = (first + rng.integers(1, num_identities, size=first.size)) % num_identities
    order = rng.permutation(num_pairs)
    slots = np.concatenate([same, np.stack([first, second], axis=1)])[order].reshape(-1)
    return slots, (np.arange(num_pairs) < num_same)[order]


def raw_pixel_accuracy(bin_path):
    """The raw-pixel cosine baseline on a .bin: the same protocol and numbers as training's
    final report (sample_fc.verification with raw_pixel_embed)."""
    from ..verification import evaluate, raw_pixel_embed
    images, issame = load_bin(bin_path)
    return evaluate(raw_pixel_embed, images, issame).accuracy


def demo_image_count(num_identities=200, images_per_identity=40, num_pairs=600):
    """How many images make_demo renders (training images and both sides of every pair)."""
    return num_identities * images_per_identity + 2 * num_pairs


def make_demo(out_dir, seed=0, num_identities=200, images_per_identity=40, num_val_identities=100,
              num_pairs=600, image_size=32, quality=95, progress=None):
    """Write out_dir/train.rec, train.idx, property and demo_val.bin; return a summary dict.
    progress(n), when given, is told each time n more images are rendered. UsageError naming
    a bad count or size, or an out_dir that is a file."""
    for name, value, low in (("seed", seed, 0), ("num_identities", num_identities, 1),
                             ("images_per_identity", images_per_identity, 1), ("image_size", image_size, 16),
                             ("num_val_identities", num_val_identities, 2), ("num_pairs", num_pairs, MIN_PAIRS)):
        if not (isinstance(value, (int, np.integer)) and value >= low):
            raise UsageError(f"{name} must be an integer >= {low}, got {value!r}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"{out_dir} is a file, not a folder for the demo dataset")
    os.makedirs(out_dir, exist_ok=True)
    done = progress or (lambda count: None)
    with RecordWriter(os.path.join(out_dir, "train"), image_size) as writer:
        for k in range(num_identities):
            views = draw_views(np.random.default_rng((seed, TRAIN, k, 1)), images_per_identity)
            pixels = render_views(identity_template(seed, TRAIN, k), views, image_size)
            writer.add_identity([encode_jpeg(p, quality) for p in pixels])
            done(images_per_identity)
        writer.finish()
    # Pairs of held-out identities: half the same identity (two views), half two different ones.
    slots, issame = verification_pairs(np.random.default_rng((seed, PAIRS)), num_val_identities, num_pairs)
    encoded = [None] * len(slots)
    for v in np.unique(slots):
        where = np.nonzero(slots == v)[0]
        views = draw_views(np.random.default_rng((seed, VAL, int(v), 1)), len(where))
        rendered = render_views(identity_template(seed, VAL, int(v)), views, image_size)
        for slot, pixels in zip(where, rendered):
            encoded[slot] = encode_jpeg(pixels, quality)
        done(len(where))
    bin_path = os.path.join(out_dir, "demo_val.bin")
    write_bin(bin_path, encoded, issame)
    return {"out_dir": out_dir, "num_images": num_identities * images_per_identity,
            "num_classes": num_identities, "val_identities": sorted(int(x) for x in np.unique(slots)),
            "num_pairs": num_pairs,
            "raw_pixel_accuracy": raw_pixel_accuracy(bin_path)}


DEMO_FILES = ("train.rec", "train.idx", "property", "demo_val.bin")


def ensure_demo(out_dir, log=print):
    """Build the default demo dataset in out_dir unless it is already there; returns whether
    it built it. Safe when several processes (the ranks of a job, or two jobs) call it at
    once: one builds, under an exclusive lock on a file beside out_dir, into a temporary
    sibling folder that is renamed into place when complete; the others wait for the lock
    and find it done. A half-written out_dir is never seen and never left behind."""
    import fcntl
    import shutil
    import tempfile

    def complete():
        return all(os.path.isfile(os.path.join(out_dir, name)) for name in DEMO_FILES)

    if complete():
        return False
    parent, base = os.path.split(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    with open(os.path.join(parent, f".{base}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete():
            return False
        if os.path.exists(out_dir):
            raise UsageError(f"{out_dir} exists but lacks {', '.join(DEMO_FILES)}: not a demo "
                             f"dataset; remove it (it is rebuilt on the next run) or pick another rec")
        log(f"building the demo dataset in {out_dir} (first run only, a few seconds)")
        building = tempfile.mkdtemp(prefix=f".{base}.building.", dir=parent)
        try:
            make_demo(building)
            os.rename(building, out_dir)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return True

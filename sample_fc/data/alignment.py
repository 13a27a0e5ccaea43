"""The 5-point similarity alignment of a face: its landmarks onto the field's template.

Landmarks are (5, 2) arrays of (x, y) in the order left eye, right eye, nose tip, left mouth
corner, right mouth corner ("left" as seen in the image), in pixels with pixel centres at
integers (as landmark files, OpenCV and sample_fc.data.face_detector give them; PIL puts
centres at +0.5). tools.ijb aligns by given landmarks, tools.align by detected ones.
"""
import numpy as np
from PIL import Image

# The five-point template of a 112x112 aligned face (left eye, right eye, nose tip, left and
# right mouth corners; pixel centres at integers), as insightface's alignment uses it.
TEMPLATE_112 = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366],
                         [41.5493, 92.3655], [70.7299, 92.2041]])


def template(size):
    """(5, 2) the template scaled to a size x size crop."""
    return TEMPLATE_112 * size / 112.0


def similarity_transform(source, target):
    """The 2x3 matrix M of the similarity (rotation, uniform scale, translation; no
    reflection) that maps the (K, 2) points `source` onto `target` with the least squared
    error: target ~ M @ [x, y, 1]."""
    rows, values = [], []
    for (x, y), (u, v) in zip(source, target):
        rows += [[x, -y, 1, 0], [y, x, 0, 1]]
        values += [u, v]
    (a, b, tx, ty), *_ = np.linalg.lstsq(np.array(rows, float), np.array(values, float), rcond=None)
    return np.array([[a, -b, tx], [b, a, ty]])


def align(image, landmarks, size):
    """uint8 (size, size, 3) RGB: the PIL `image` warped (bilinear) so that its (5, 2)
    landmarks land on the template scaled to `size`."""
    matrix = similarity_transform(landmarks, template(size))
    inverse = np.linalg.inv(np.vstack([matrix, [0, 0, 1]]))[:2]
    linear, shift = inverse[:, :2], inverse[:, 2]
    shift = shift + 0.5 - linear @ [0.5, 0.5]
    coefficients = (linear[0, 0], linear[0, 1], shift[0], linear[1, 0], linear[1, 1], shift[1])
    return np.asarray(image.convert("RGB").transform((size, size), Image.AFFINE, coefficients, Image.BILINEAR))

"""Whether loaded weights are ones a trained network could hold: every value finite and below
MAX_WEIGHT in magnitude. A byte flipped in a weights file that still parses (MXNet's .params,
a .pth, an ONNX initializer) most often lands in a float's exponent: a NaN, an infinity, or a
top exponent bit that makes 0.05 into 4e36; each gives NaN embeddings, or a training run that
stops at its first steps with non-finite losses."""
import numpy as np

MAX_WEIGHT = 1e20       # no trained parameter comes near; a flipped top exponent bit lands far above


def implausible_values(values):
    """'3 non-finite values (NaN or infinity) of 576', 'a value of magnitude 4e+36 (...)', or None."""
    finite = np.isfinite(values)
    if not finite.all():
        return f"{int(values.size - finite.sum())} non-finite values (NaN or infinity) of {values.size}"
    largest = float(np.abs(values).max()) if values.size else 0.0
    if largest > MAX_WEIGHT:
        return f"a value of magnitude {largest:.3g} (a trained network's stay below {MAX_WEIGHT:g})"
    return None

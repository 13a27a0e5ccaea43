"""Test that importing the Horovod layer does not break JPEG decoding (libjpeg symbol clash)."""
import subprocess
import sys

from conftest import REPO


def test_jpeg_decodes_after_importing_dist():
    """Test that Pillow still decodes a JPEG once sample_fc.dist (horovod.mxnet) is imported."""
    code = (
        "import io, numpy as np\n"
        "import sample_fc.dist\n"
        "from PIL import Image\n"
        "pixels = (np.arange(48 * 48 * 3) % 251).astype(np.uint8).reshape(48, 48, 3)\n"
        "buffer = io.BytesIO(); Image.fromarray(pixels).save(buffer, 'JPEG', quality=95)\n"
        "decoded = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert('RGB'))\n"
        "assert decoded.shape == (48, 48, 3), decoded.shape\n"
        "print('DECODED')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=str(REPO), timeout=120)
    assert "DECODED" in result.stdout, result.stderr[-2000:]

"""Tests for scripts/patch_horovod.py, the source fix applied before building Horovod."""
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "scripts" / "patch_horovod.py"
GLOO_CONTROLLER = "horovod/common/gloo/gloo_controller.cc"
BUGGY = "  global_ranks_.reserve(size_);\n  {\n    auto this_global_rank = 0;\n"


def _tree(tmp_path, text):
    path = tmp_path / GLOO_CONTROLLER
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def _patch(tmp_path):
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)


def test_fixes_the_gloo_rank_list_and_is_idempotent(tmp_path):
    """Test that reserve() becomes resize() and nothing else changes, also on a second run."""
    path = _tree(tmp_path, BUGGY)
    for _ in range(2):
        result = _patch(tmp_path)
        assert result.returncode == 0, result.stderr
        assert path.read_text() == BUGGY.replace("reserve(size_)", "resize(size_)")


def test_unexpected_source_stops_with_the_file_named(tmp_path):
    """Test that a source without the expected text (another Horovod) fails, naming file and text."""
    path = _tree(tmp_path, "  global_ranks_.assign(size_, 0);\n")
    result = _patch(tmp_path)
    assert result.returncode != 0
    assert GLOO_CONTROLLER in result.stderr and "global_ranks_.reserve(size_);" in result.stderr
    assert path.read_text() == "  global_ranks_.assign(size_, 0);\n"


def test_missing_file_is_reported(tmp_path):
    """Test that a directory that is not a Horovod source tree fails with "not found"."""
    result = _patch(tmp_path)
    assert result.returncode != 0 and "not found" in result.stderr

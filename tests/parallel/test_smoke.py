"""Test that Horovod's collectives on MXNet NDArrays run on 2 local workers (Gloo and MPI)."""
import os

import pytest

from conftest import mpi_available, per_rank_tail


def _check(result):
    assert result.returncode == 0, per_rank_tail(result.output)
    for rank in range(2):
        assert f"SMOKE_OK rank={rank} size=2" in result.stdout, per_rank_tail(result.output)


def test_gloo_collectives(horovod_job):
    """Test that allreduce, allgather and broadcast give the expected values under Gloo."""
    _check(horovod_job("smoke_collectives.py", controller="gloo", timeout_s=120))


@pytest.mark.skipif(not mpi_available() and os.environ.get("CI") != "true",
                    reason="OpenMPI not installed (CI installs it; locally: apt-get install libopenmpi-dev openmpi-bin)")
def test_mpi_collectives(horovod_job):
    """Test that the same collectives give the expected values under the MPI controller."""
    assert mpi_available(), "CI must have OpenMPI (mpirun) installed by .ci/run"
    _check(horovod_job("smoke_collectives.py", controller="mpi", timeout_s=120))


@pytest.mark.parametrize("clip", [0.0, 2.0, 1000.0])
def test_gradients_are_summed_over_ranks_then_clipped_to_the_global_norm(horovod_job, clip):
    """Test that BackboneOptimizer.sum_gradients on 2 ranks with different gradients makes
    the next update apply the sum over ranks, scaled to a global norm of at most `clip` over
    all parameters together (NumPy reference in the worker); 0 = no clipping. The sum's norm
    is about 5.8, so clip 2 scales and clip 1000 does not."""
    result = horovod_job("clip_gradients.py", clip, timeout_s=120)
    assert result.returncode == 0, per_rank_tail(result.output)
    lines = [l for l in result.output.splitlines() if "CLIP_OK" in l]
    assert len(lines) == 2, per_rank_tail(result.output)
    scales = {float(l.rsplit("scale=", 1)[1]) for l in lines}
    assert (scales == {1.0}) == (clip in (0.0, 1000.0)), lines


@pytest.mark.parametrize("work", ["uneven", "none"])
def test_pace_keeps_uneven_ranks_in_step(horovod_job, work):
    """Test that dist.Pace makes every rank hold its 100 meetings whatever its share of the work
    (none at all on one rank too), and that a fast rank waits in each meeting only for a
    hundredth of the slow rank's work (10 ms here; under 0.25 s on a loaded machine), where waiting once at the end
    would cost it the whole second; its progress is said every tenth (nine lines, 10% to 90%)."""
    import json
    result = horovod_job("pace_uneven.py", work, timeout_s=120)
    assert result.returncode == 0, per_rank_tail(result.output)
    found = {r["rank"]: r for r in (json.loads(l.split("PACE ", 1)[1]) for l in result.output.splitlines()
                                    if "PACE {" in l)}
    assert sorted(found) == [0, 1] and all(r["meetings"] == 100 for r in found.values()), found
    if work == "uneven":
        assert found[0]["longest_wait_s"] < 0.25 and found[0]["total_wait_s"] > 0.5, found[0]
        assert [line.split("%")[0].rsplit(" ", 1)[1] for line in found[0]["said"]] == [str(p) for p in range(10, 100, 10)]


def test_agree_tells_every_rank_every_ranks_outcome(horovod_job):
    """Test that dist.agree gives both ranks every rank's problem in rank order (rank 1's listed
    error described) and, when asked, every rank's result; each rank keeps its own result, and
    without share_results nothing but the problems travels."""
    import json
    result = horovod_job("agree.py", timeout_s=120)
    assert result.returncode == 0, per_rank_tail(result.output)
    found = {r["rank"]: r for r in (json.loads(l.split("AGREE ", 1)[1]) for l in result.output.splitlines()
                                    if "AGREE {" in l)}
    assert sorted(found) == [0, 1], found
    for seen in found.values():
        own = {"rank": 0} if seen["rank"] == 0 else None
        assert seen["failed"] == [own, [None, "rank 1: disk full"], [{"rank": 0}, None]], seen
        assert seen["passed"] == [seen["rank"] * 10, [None, None], None], seen

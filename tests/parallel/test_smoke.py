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

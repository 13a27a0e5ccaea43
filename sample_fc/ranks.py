"""The launcher's rank, readable before Horovod starts (horovodrun under Gloo or MPI, mpirun,
srun). A leaf module: it imports only os, so train.py and dist.py read it without importing
the launcher."""
import os

LAUNCHER_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def launcher_rank():
    """This process's rank as its launcher set it (horovodrun under Gloo or MPI, mpirun,
    srun), readable before Horovod starts; 0 when there is no launcher."""
    for variable in LAUNCHER_RANK_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return 0


def launched():
    """Whether a launcher (horovodrun, mpirun, srun) started this process."""
    return any(os.environ.get(variable, "").isdigit() for variable in LAUNCHER_RANK_VARIABLES)

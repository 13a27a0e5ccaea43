"""The launcher's rank and local worker count, readable before Horovod starts (horovodrun under
Gloo or MPI, mpirun, srun), and each worker's share of the cores. A leaf module: it imports
only os, so train.py reads it before importing mxnet, and dist.py without the launcher."""
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


LAUNCHER_LOCAL_SIZE_VARIABLES = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                 "SLURM_NTASKS_PER_NODE")


def launcher_local_size():
    """How many workers the launcher started on this node (1 when there is no launcher)."""
    for variable in LAUNCHER_LOCAL_SIZE_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def cores_per_worker(local_workers, cores=None):
    """`cores` (default: this node's) shared by `local_workers` workers: cores // workers, at least 1."""
    return max(1, (cores or os.cpu_count() or 1) // max(1, local_workers))


def share_cores():
    """Unless the environment sets them: OpenMP threads = this worker's share of the node's
    cores (cores // local workers, at least 1), and one MXNet engine worker thread (its ops
    then use those OpenMP threads one at a time). Without this every worker of `horovodrun
    -np 2` on 2 cores starts 2 of each, and several engine threads running ops that each use
    every OpenMP thread slow a step (docs/benchmarks-history.md). Must run before mxnet is imported."""
    os.environ.setdefault("OMP_NUM_THREADS", str(cores_per_worker(launcher_local_size())))
    os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")

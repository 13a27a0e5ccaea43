"""sample_fc: Partial FC for MXNet + Horovod."""

"""The Partial FC layer: class centers sharded over the workers, a sample of them scored per step,
an exact softmax across workers. It imports nothing of run/, models/, checkpoint/, data/,
tools/ or bench/ (a shard on disk is checkpoint/bank_shard.py's).

    partial_fc.py        PartialFC (bank + sampler + head + the bank's optimizer), PartialFCOptions;
                         its state door (state_dict: the sampler's RNG, the margin's running mean)
    bank_optimizer.py    MemoryBankSGDOptimizer: SGD-momentum on the sampled rows (both kernels apply it)
    sampler.py           which centers a step scores: the batch's positives plus random negatives
    margin.py            the margins (ArcFace / CosFace combined; CurricularFace, whose running mean
                         of target cosines is the layer's state), their warm-up schedule, and each
                         margin word's keys and published settings (MXNet-free until an NDArray comes)
    head.py              the head step's contract (Head) and the host kernel (HostHead, NumPy BLAS on a
                         bank in host memory: the default CPU bank's)
    device_head.py       the device kernel (DeviceHead, MXNet operators on the bank's context): the
                         distributed margin softmax and the head as pure functions
    memory_bank.py       a rank's shard of centers and their momentum, in row blocks
    row_storage.py       how rows are stored (float32 / float16 / int8; momentum the same, int8 or none),
                         read as float32 and written back: the one module that knows the formats
    rounding.py, momentum_codec.py, _half_rows.c    float16 stochastic rounding, 8-bit momentum
    sampling_regime.py   q*K/B: how often a center is drawn per visit of its class; the safe ratio
    center_optimizer.py  the centers' optimizer (momentum or none) by C/B, and the line that says it
    global_tail.py       tail_bn=global: the backbone's last layers (its BatchNorms over samples only)
                         run on the gathered global batch beside the head, on every worker
"""

"""The valid values of the library's options, in one place.

sample_fc.config checks a config against these and the library checks its arguments against
them; this module imports nothing heavy, so the configuration stays light.
"""
import numbers
import signal

CONTEXTS = ("auto", "cpu", "gpu")           # backbone device: auto = gpu when MXNet sees one
BANK_CONTEXTS = ("same", "cpu")             # memory bank device: the backbone's, or host memory
ALLGATHERS = ("native", "allreduce")        # dist.allgather strategies
HEAD_KERNELS = ("auto", "host", "device")   # partial_fc.make_head kernels
LR_SCHEDULES = ("step", "poly", "cosine")   # optimizers.make_schedule kinds
BACKBONE_INITS = ("arcface_torch", "pytorch", "xavier")    # initializers.backbone_initializer kinds
MOMENTUM_FORMS = ("pytorch", "mxnet")       # optimizers: what SGD momentum accumulates
OPTIMIZERS = ("sgd", "adamw")               # optimizers.make_backbone_optimizer: the backbone's (the bank's is SGD)
OPTIMIZER_STATES = {"sgd": 1, "adamw": 2}   # arrays of state per backbone parameter (the memory plan)
BANK_DTYPES = ("float32", "float16", "int8")  # memory_bank: how class centers (and a momentum stored alike) are stored
BANK_MOMENTA = ("same", "int8", "none")     # memory_bank: the centers' momentum as the weights, 8-bit, or none
BANK_MOMENTUM_WORDS = ("auto",) + BANK_MOMENTA   # the config's: auto is resolved at start (pfc/center_optimizer.py)
EMBEDDING_SCALES = ("fixed", "learned")     # symbols.with_learned_embedding_scale: the embedding BatchNorm's gamma
WANDB_MODES = ("off", "offline", "online")   # run/scalar_log.py: Weights & Biases off, files only, or synced
TAIL_BNS = ("worker", "global")             # global_tail: the BatchNorms over samples only on each worker's batch
                                            # or the global one


def check_momentum_form(momentum_form):
    """ValueError unless momentum_form is one of MOMENTUM_FORMS (both optimizers take one)."""
    if momentum_form not in MOMENTUM_FORMS:
        raise ValueError(f"momentum_form must be one of {MOMENTUM_FORMS}, got {momentum_form!r}")


def is_probability(value):
    """A real number (not a bool) in [0, 1]: the aug_* config keys, Augmentation's fields."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value <= 1
def signal_number(name):
    """signal.SIGTERM's number for 'SIGTERM' or 'TERM' (ValueError naming the valid ones)."""
    name = name.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    if not hasattr(signal, name) or name in ("SIGKILL", "SIGSTOP"):
        raise ValueError(f"{name} is not a signal a run can stop on; e.g. SIGTERM, SIGINT, SIGUSR1")
    return int(getattr(signal, name))

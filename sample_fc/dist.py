"""Every collective of sample_fc, and the only module that calls Horovod.

Rules for every call below, as in Horovod's own API: all ranks must make the same
collective calls in the same order with the same `name`; shapes and dtypes that must
match across ranks are stated per function. A rank that skips a call hangs the others
until Horovod's stall check or the job's timeout ends the run.
"""
import contextlib
import os
import sys
import time
from dataclasses import dataclass

# Pillow's JPEG decoder must be loaded before horovod.mxnet: Horovod loads its library
# with RTLD_GLOBAL, and the libjpeg symbols of libmxnet.so it drags in would otherwise
# bind to Pillow's decoder and break it ("broken data stream when reading image file").
from PIL import Image  # noqa: F401  (import order matters, see above)
import horovod.mxnet as hvd
import mxnet as mx

# For the same reason torch cannot be imported after this point: its library then crashes
# the process while loading (a segfault, or glibc's "free(): invalid size"). Libraries import
# it when it is installed (tensorboardX does, for the scalars training writes), so from here
# on an import of torch fails with ImportError, which they take for "not installed". A process
# that imported torch first keeps it.
if "torch" not in sys.modules:
    sys.modules["torch"] = None

from .options import ALLGATHERS
from .ranks import launched

_started = False          # init() ran in this process
# Horovod's background thread negotiates with the other ranks every cycle, busy or idle: at its
# default 1 ms it takes a share of a core per worker away from the compute; 5 ms (Horovod's own
# default before 0.21) costs at most 5 ms per collective (measured: docs/benchmarks-history.md)
CPU_CYCLE_TIME_MS = 5
# Horovod's stall check (and its warning) runs every collective_timeout_s / this, at least 1 s
STALL_CHECKS_PER_LIMIT = 10


def init(stall_shutdown_s=None, on_cpu=False):
    """Initialise Horovod (idempotent). Call once per process before anything below.

    stall_shutdown_s: when some ranks have waited this long in a collective that others
    have not joined, Horovod shuts the job down (its stall inspector) instead of hanging.
    Its check runs every tenth of that (STALL_CHECKS_PER_LIMIT): a stalled collective that
    Horovod had cached is first dropped from the cache at a check, then timed afresh, so the
    job ends within about the limit plus two checks (at half the limit it took 2-2.5x).
    The same limit is Gloo's own (HOROVOD_GLOO_TIMEOUT_SECONDS, 30 s by default): how long
    a rank waits for a peer that sends nothing at all, not even Horovod's negotiation (a
    stopped, swapped or starved process; a lost node), and its rendezvous at start.
    on_cpu: the backbone trains on the CPU, so Horovod's background thread polls every
    CPU_CYCLE_TIME_MS instead of its 1 ms (CPU_CYCLE_TIME_MS above).
    Values given to horovodrun (--stall-check-*) or in the environment take precedence.
    """
    if on_cpu:
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(CPU_CYCLE_TIME_MS))
    if stall_shutdown_s:
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS",
                              str(max(1, int(stall_shutdown_s) // STALL_CHECKS_PER_LIMIT)))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(int(stall_shutdown_s)))
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(int(stall_shutdown_s)))
    global _started
    if not hvd.is_initialized():
        with _alone_on_gloo():
            hvd.init()
    _started = True


ALONE_CONTROLLER = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}


@contextlib.contextmanager
def _alone_on_gloo():
    """A process that no launcher started (python train.py, a test) is a world of one: it
    starts Horovod on Gloo, never MPI. MPI would start a singleton, which forks an `orted`
    daemon from Horovod's background thread while MXNet's engine threads run (MXNet stops and
    restarts its engine around every fork). The environment is as it was afterwards, so
    no job this process launches inherits the choice; settings given in it are kept."""
    chosen = {} if launched() else {k: v for k, v in ALONE_CONTROLLER.items() if k not in os.environ}
    os.environ.update(chosen)
    try:
        yield
    finally:
        for name in chosen:
            os.environ.pop(name, None)


def is_started():
    """Whether init() ran in this process (Horovod may be shut down since)."""
    return _started


PEER_LOST = ("Horovod has been shut down", "Connection reset by peer", "Connection closed by peer",
             "Broken pipe", "Application timeout caused pair closure", "Timed out waiting")


def is_shutdown_error(error):
    """Whether `error` (raised by a collective) means the job is ending around this rank:
    Horovod shut down (a rank failed, or the stall inspector gave up on one; see init), Gloo
    lost the connection to a rank that exited, or Gloo's own timeout: a peer sent nothing for
    the limit (init's stall_shutdown_s)."""
    return any(text in str(error) for text in PEER_LOST)


def shutdown():
    """Stop Horovod's background thread (every rank, after its last collective)."""
    if hvd.is_initialized():
        hvd.shutdown()


def rank():
    return hvd.rank()


def size():
    return hvd.size()


def local_rank():
    return hvd.local_rank()


def local_size():
    return hvd.local_size()


@dataclass(frozen=True)
class World:
    """This process's place in the job: its rank, the workers, its rank and their count on its node."""
    rank: int
    size: int
    local_rank: int = 0
    local_size: int = 1


def world():
    return World(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())


def allgather(array, name, strategy="native"):
    """Concatenate every rank's `array` along axis 0, in rank order.

    Must match across ranks: name, strategy, dtype, shape[1:]; with strategy
    "allreduce" also shape[0]. "native" uses Horovod's allgather; "allreduce" writes the
    rows into a zeroed (W * n, ...) buffer at this rank's offset and sums it over ranks
    (the original Partial FC's way; exact for any values since the other rows add zeros).
    """
    if strategy == "native":
        return hvd.allgather(array, name=name)
    if strategy != "allreduce":
        raise ValueError(f"allgather strategy must be one of {ALLGATHERS}, got {strategy!r}")
    rows = array.shape[0]
    buffer = mx.nd.zeros((rows * size(),) + array.shape[1:], ctx=array.context, dtype=array.dtype)
    buffer[rank() * rows:(rank() + 1) * rows] = array
    return hvd.allreduce_(buffer, op=hvd.Sum, name=name)


def allreduce_sum(array, name):
    """Element-wise sum over ranks (a new array). Must match: name, shape, dtype."""
    return hvd.allreduce(array, op=hvd.Sum, name=name)


def grouped_allreduce_sum_(arrays, name):
    """In-place sum over ranks of several arrays in one fused call. Must match: name, and the
    arrays' number, order, shapes and dtypes."""
    return hvd.grouped_allreduce_(list(arrays), op=hvd.Sum, name=name)


def allreduce_max(array, name):
    """Element-wise max over ranks (a new array). Must match: name, shape, dtype."""
    return hvd.allreduce(array, op=hvd.Max, name=name)


def reducescatter_sum(array, name):
    """Sum over ranks, then this rank's block of rows: rows [r*n/W, (r+1)*n/W).

    Must match: name, shape, dtype; shape[0] must be divisible by the world size (each
    rank contributed the same number of rows to the matching allgather).

    Done as an allreduce and a slice, not Horovod's reducescatter: on Gloo (Horovod 0.28.1's
    ReduceScatterHalvingDoubling) one reducescatter leaves every later allreduce in the
    process ~10x slower (docs/benchmarks-history.md). The array is the global batch's
    embedding gradients (B x D, 0.26 MB at B=128, D=512): twice a reducescatter's traffic
    costs nothing next to the backbone's gradients.
    """
    if array.shape[0] % size():
        raise ValueError(f"reducescatter needs rows divisible by world size {size()}, "
                         f"got shape {array.shape}")
    rows = array.shape[0] // size()
    total = hvd.allreduce(array, op=hvd.Sum, name=name)
    return total[rank() * rows:(rank() + 1) * rows]


def broadcast_parameters(params, root_rank=0, prefix="param"):
    """Broadcast a dict name -> NDArray in place, in sorted-name order.

    Must match: the set of names, and each array's shape and dtype.
    """
    for key in sorted(params):
        hvd.broadcast_(params[key], root_rank=root_rank, name=f"{prefix}.{key}")


def allgather_object(obj, name):
    """List of every rank's picklable object, in rank order. Must match: name."""
    return hvd.allgather_object(obj, name=name)


def agree(work, name, errors, describe=str, share_results=False):
    """Run this rank's `work()`; then every rank learns every rank's problem, in rank order: None
    where work returned, describe(error) where it raised one of `errors` (others propagate); with
    `share_results`, every rank's (picklable) result too. Returns (this rank's result, [problem
    per rank], [result per rank] or None). Every rank must call it with the same name."""
    try:
        result, problem = work(), None
    except errors as error:
        result, problem = None, describe(error)
    if not share_results:
        return result, allgather_object(problem, name), None
    gathered = allgather_object((problem, result), name)
    return result, [p for p, _ in gathered], [r for _, r in gathered]


def barrier(name):
    """Return only when every rank has reached the barrier with the same name."""
    hvd.allreduce(mx.nd.zeros(1), op=hvd.Sum, name=f"barrier.{name}").wait_to_read()


PACE_MEETINGS = 100        # Pace: the ranks meet after each hundredth of their work


class Pace:
    """Work every rank does at once (a bank's initial centers, reading a checkpoint), kept in
    step: after each hundredth of its own work a rank meets the others in one small collective
    (`barrier`), so no rank ever waits in a collective for longer than the slowest takes for a
    hundredth of its work, where waiting at the end would cost the whole difference between
    the ranks (minutes for a bank of tens of millions of rows; more than collective_timeout_s
    ended such a start). Every rank holds exactly PACE_MEETINGS meetings, whatever its share.
    `say(line)` (rank 0's log, or None) hears the progress every tenth once the work has taken
    `say_after_s`.

        pace = Pace("the bank's initial centers", rows_of_this_rank, say)
        pace(rows)          # after each piece of work
        pace.finish()       # the meetings not held yet (all of them for a rank with nothing to do)
    """

    def __init__(self, what, total, say=None, say_after_s=10.0, clock=time.monotonic):
        self.what, self.total, self.say, self.say_after_s = what, total, say, say_after_s
        self.clock = clock
        self.done = self.met = 0
        self.started = self.clock()

    def __call__(self, amount):
        """`amount` more of this rank's work is done: hold the meetings it has reached."""
        self.done += amount
        reached = PACE_MEETINGS if self.total <= 0 else min(PACE_MEETINGS, self.done * PACE_MEETINGS // self.total)
        while self.met < reached:
            self._meet()

    def finish(self):
        while self.met < PACE_MEETINGS:
            self._meet()

    def _meet(self):
        self.met += 1
        barrier(f"pace.{self.what}")
        elapsed = self.clock() - self.started
        if self.say and self.met % 10 == 0 and self.met < PACE_MEETINGS and elapsed >= self.say_after_s:
            left = elapsed * (PACE_MEETINGS - self.met) / self.met
            self.say(f"{self.what}: {self.met}% of {self.total:,} rows per worker (the slowest worker's pace), "
                     f"{elapsed:.0f} s so far, about {left:.0f} s left")

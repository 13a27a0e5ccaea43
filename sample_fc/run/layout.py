"""The CPU layout ./horovodrun.sh picks when no -np is given: how many workers share this node's
cores (each then takes cores // workers OpenMP threads, ranks.share_cores), chosen by measurement.

    python train.py [arguments] --print-layout     # what ./horovodrun.sh asks (run/launch.py)

prints one JSON object: {"np": workers, "train_args": [train.py arguments to add], "line": what
to tell the user}; a mistake in the arguments: train.py's own one line, exit 2.

MEASURED holds step_breakdown's samples/s of one network at one image size as 1 and as 2
workers at the same global batch on a node of `cores` cores (the networks' rows, symbols/catalog.py
MEASURED_LAYOUTS; BENCHMARKS.md, "The CPU layout").
A new run takes the layout of the measured case on its node's core count nearest to it in
multiply-adds per image (log scale: the backbone's cost, symbols.cost, at its image size); on
a core count nothing was measured on it keeps the default, DEFAULT_WORKERS. The global batch
stays the default layout's (DEFAULT_WORKERS x batch_size, the batch the preset's lr is scaled
for): another worker count gets `--set batch_size=<global / workers>`. A resumed run keeps the
world size it was trained with (its checkpoint's), whatever it measured.
"""
import dataclasses
import math

from ..symbols.catalog import MEASURED_LAYOUTS, MeasuredLayout
from ..ranks import cores_per_worker

DEFAULT_WORKERS = 2        # horovodrun.sh's -np when no layout is chosen (-H, --gpu)


Measured = MeasuredLayout     # a measured case: network, image_size, cores, {workers: samples/s}, source
MEASURED = MEASURED_LAYOUTS   # the networks' rows (symbols/catalog.py)


@dataclasses.dataclass(frozen=True)
class Layout:
    workers: int
    batch_size: int              # per worker
    line: str


def describe(workers, cores):
    per = cores_per_worker(workers, cores)
    return f"{workers} worker{'s' * (workers > 1)} x {per} thread{'s' * (per > 1)}"


def nearest(multiply_adds, cores, cost_of, measured=MEASURED):
    """The measured case on `cores` cores nearest to `multiply_adds` per image (log scale), or
    None; cost_of(network, image_size) gives a measured case's multiply-adds per image."""
    here = [case for case in measured if case.cores == cores]
    if not here:
        return None
    return min(here, key=lambda case: abs(math.log(cost_of(case.network, case.image_size) / multiply_adds)))


def choose(network, image_size, batch_size, multiply_adds, cores, cost_of, measured=MEASURED):
    """The Layout of a new run of `network` at `image_size` px (`multiply_adds` per image, per
    worker `batch_size` under the default layout) on a node of `cores` cores."""
    case = nearest(multiply_adds, cores, cost_of, measured)
    if case is None:
        return Layout(DEFAULT_WORKERS, batch_size,
                      f"layout {describe(DEFAULT_WORKERS, cores)}, the default: no layout was measured on {cores} "
                      f"cores (python -m bench.step_breakdown --networks {network} --sizes {image_size} "
                      f"--worlds 1,2 measures yours); -np N chooses")
    global_batch, workers = DEFAULT_WORKERS * batch_size, case.workers
    if global_batch % workers:
        return Layout(DEFAULT_WORKERS, batch_size, f"layout {describe(DEFAULT_WORKERS, cores)}, the default: the "
                      f"global batch {global_batch} does not split over the {workers} workers measured fastest "
                      f"for {case.network} at {case.image_size} px; -np N chooses")
    other = min(case.samples_per_s, key=case.samples_per_s.get)
    measured = f"{case.network} at {case.image_size} px"
    if (case.network, case.image_size) != (network, image_size):
        measured += (f", the measured case nearest in cost ({multiply_adds / 1e9:.3g} G multiply-adds per image "
                     f"here, {cost_of(case.network, case.image_size) / 1e9:.3g} G there)")
    batch = f", batch_size {global_batch // workers} (the global batch {global_batch} kept)" \
        if workers != DEFAULT_WORKERS else ""
    return Layout(workers, global_batch // workers,
                  f"layout {describe(workers, cores)}{batch}: measured fastest on {case.cores} cores for {measured}: "
                  f"{case.samples_per_s[workers]:g} samples/s against {case.samples_per_s[other]:g} as "
                  f"{describe(other, case.cores)} ({case.source}); -np N chooses")


def for_run(cfg, cores, cost_of, resumed_world=None):
    """{"np", "train_args", "line"} for a run of config `cfg` on `cores` cores (what
    `train.py --print-layout` prints); cost_of(network, image_size): multiply-adds per image.
    A resumed run (`resumed_world`: its checkpoint's world size) keeps its world size; a GPU
    run (context=gpu) is not laid out here (line None)."""
    if resumed_world is not None:
        return {"np": resumed_world, "train_args": [],
                "line": f"layout {describe(resumed_world, cores)}: the world size the resumed run was trained "
                        f"with (-np N chooses)"}
    if cfg.context == "gpu":
        return {"np": DEFAULT_WORKERS, "train_args": [], "line": None}
    layout = choose(cfg.network, cfg.image_size, cfg.batch_size, cost_of(cfg.network, cfg.image_size), cores, cost_of)
    extra = ["--set", f"batch_size={layout.batch_size}"] if layout.batch_size != cfg.batch_size else []
    return {"np": layout.workers, "train_args": extra, "line": layout.line}



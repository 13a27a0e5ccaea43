"""The toolkit's figures, drawn with matplotlib's Agg backend (no display): quantities over
training steps with the run's events marked on the step axis, and ROC curves (TAR against FAR,
log scale). python -m sample_fc.tools.report and python -m sample_fc.tools.ijb draw through
these functions only. Every figure is 640 x 400 pixels (three fit across a 1280 px page). A noisy
quantity is drawn smoothed (an exponential moving average, as TensorBoard's) over its raw values,
drawn faint behind in the same colour.
"""
import base64
import math

import numpy as np

import matplotlib
matplotlib.use("Agg")                # before pyplot: files only, never a window
import matplotlib.pyplot as plt  # noqa: E402

SIZE_INCHES, DPI = (6.4, 4.0), 100    # 640 x 400 PNGs
SMOOTHING = 0.8                       # the moving average's weight of the past (TensorBoard's slider)
# how each kind of run event is marked on the step axis: (label, colour, line style)
EVENT_STYLES = {
    "checkpoint": ("checkpoint", "0.6", ":"),
    "restart": ("resume / restart", "tab:orange", "--"),
    "stop": ("stop", "tab:red", "-"),
    "skipped": ("skipped step (non-finite)", "tab:purple", "-."),
    "not_learning": ("not-learning warning", "tab:brown", "-"),
}
ROC_FAR_FLOOR = 1e-6                  # the lowest FAR a ROC figure shows
FEW_POINTS = 30                       # a line of this many points or fewer has them marked


def roc_points(scores, labels):
    """(FAR, TAR) of every threshold between distinct scores (higher = more alike; label 1 =
    genuine), FAR increasing."""
    order = np.argsort(-np.asarray(scores, float), kind="stable")
    genuine = np.asarray(labels)[order] == 1
    tar = np.cumsum(genuine) / max(genuine.sum(), 1)
    far = np.cumsum(~genuine) / max((~genuine).sum(), 1)
    return far, tar


def _new_axes(title, xlabel, ylabel):
    figure, axes = plt.subplots(figsize=SIZE_INCHES, dpi=DPI)
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, color="0.9")
    return figure, axes


def _save(figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)    # not bbox_inches="tight": the size stays 640 x 400
    plt.close(figure)
    return path


def mark_events(axes, events):
    """Vertical lines at the steps of `events` [(step, kind)], one legend entry per kind."""
    labelled = set()
    for step, kind in events:
        label, colour, style = EVENT_STYLES[kind]
        axes.axvline(step, color=colour, linestyle=style, linewidth=1, alpha=0.8,
                     label=None if kind in labelled else label)
        labelled.add(kind)


def smoothed(values, weight=SMOOTHING):
    """The exponential moving average of `values`, debiased at the start (TensorBoard's)."""
    out, average = np.empty(len(values)), 0.0
    for index, value in enumerate(values):
        average = weight * average + (1 - weight) * value
        out[index] = average / (1 - weight ** (index + 1))
    return out


def step_figure(path, title, ylabel, series, events=(), log_y=False, smooth=False):
    """A PNG of quantities over training steps. series: [(label, steps, values)] (one line each;
    its points marked when there are few); events: [(step, kind)], kind one of EVENT_STYLES;
    `smooth`: a line of more than FEW_POINTS points drawn smoothed over its raw values, faint.
    Non-finite values are left out of the line. Returns `path`."""
    figure, axes = _new_axes(title, "step", ylabel)
    for label, steps, values in series:
        steps, values = np.asarray(steps, float), np.asarray(values, float)
        finite = np.isfinite(values)
        steps, values = steps[finite], values[finite]
        if smooth and len(values) > FEW_POINTS:
            raw = axes.plot(steps, values, linewidth=1, alpha=0.25)[0]
            axes.plot(steps, smoothed(values), linewidth=1.5, color=raw.get_color(), label=label)
            continue
        axes.plot(steps, values, marker="o" if len(values) <= FEW_POINTS else None, markersize=4,
                  linewidth=1.5, label=label)
    if log_y and any(np.nanmin(np.asarray(v, float)) > 0 for _, _, v in series if len(v)):
        axes.set_yscale("log")
    mark_events(axes, events)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8, loc="best")
    return _save(figure, path)


def roc_figure(path, curves, title, points=()):
    """A PNG of TAR against FAR (log scale from the smallest measurable FAR, at most down to
    ROC_FAR_FLOOR). curves: [(label, far, tar)]; points: [(far, tar)] marked with circles (a
    table's operating points; None values are left out). Returns `path`."""
    figure, axes = _new_axes(title, "FAR (false accept rate)", "TAR (true accept rate)")
    smallest = 1.0
    for label, far, tar in curves:
        far, tar = np.asarray(far, float), np.asarray(tar, float)
        keep = far >= ROC_FAR_FLOOR
        if keep.any():
            smallest = min(smallest, far[keep].min())
            axes.step(far[keep], tar[keep], where="post", linewidth=1.5, label=label)
    shown = [(x, y) for x, y in points if x is not None and y is not None and x >= ROC_FAR_FLOOR]
    if shown:
        axes.plot(*zip(*shown), linestyle="none", marker="o", markersize=6, markerfacecolor="none",
                  color="tab:red", label="operating points")
    axes.set_xscale("log")
    lowest = 10.0 ** math.floor(math.log10(max(min([smallest] + [x for x, _ in shown]), ROC_FAR_FLOOR)))
    axes.set_xlim(min(lowest, 1e-1), 1.0)
    axes.set_ylim(0.0, 1.02)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8, loc="lower right")
    return _save(figure, path)


def png_base64(path):
    """The PNG at `path` as base64 text, for a data: URI."""
    with open(path, "rb") as handle:
        return base64.b64encode(handle.read()).decode("ascii")

"""The centers' optimizer study, summarised from bench.compare's --results files.

    python -m bench.center_study RESULTS.jsonl [...] [--steps 50,500,1000]

Each line of a results file is one training (compare.append_result). Trainings are grouped by
data set (the --set rec's folder) and arm: sample_fc with its bank_momentum and every other
--train-arg setting (bank_lr, embedding_scale, ...), and its layout when not one worker, or the
yardstick (arcface_torch's own modules with --arcface-torch). Prints
one markdown table of held-out accuracy per seed and the mean, then the centers' mean norm and
mean turn per step (run/center_probe.py) at the chosen steps, averaged over seeds.
"""
import argparse
import json
import os
import statistics


def setting(words, key, default):
    """The value of `key=...` among --set words (the last one), or `default`."""
    found = [word.split("=", 1)[1] for word in words if word.startswith(f"{key}=")]
    return found[-1] if found else default


def arm_of(result):
    """(data set, arm label) of one training."""
    data = os.path.basename(os.path.dirname(setting(result["overrides"], "rec", "?")))
    if result["side"] != "sample_fc":
        origin = "arcface_torch's modules" if result.get("arcface_torch") else "the yardstick"
        return data, f"arcface_torch as it ships ({origin}: SGD, momentum 0.9 on the centers)"
    words = [word for word in result.get("train_args") or [] if word != "--set"]
    momentum = setting(words, "bank_momentum", "same")
    what = "no momentum (lr / (1 - m))" if momentum == "none" else f"momentum 0.9 ({momentum})"
    others = {}                                  # every other setting, the last of a key, in order
    for word in words:
        key, _, value = word.partition("=")
        if key != "bank_momentum" and value:
            others.pop(key, None)
            others[key] = value
    workers = result.get("np") or 1
    layout = f", {workers} workers x {setting(result['overrides'], 'batch_size', '?')}" if workers != 1 else ""
    return data, f"sample_fc, centers {what}" + "".join(f", {k} {v}" for k, v in others.items()) + layout


def read_results(paths):
    results = []
    for path in paths:
        with open(path) as handle:
            results += [json.loads(line) for line in handle if line.strip()]
    return results


def curve_at(results, key, step):
    values = [entry[key] for result in results for entry in result["centers"] if entry["step"] == step]
    return statistics.mean(values) if values else None


def table(results, steps):
    groups = {}
    for result in results:
        groups.setdefault(arm_of(result), []).append(result)
    lines = ["| data | arm | held-out accuracy per seed | mean | "
             + " | ".join(f"norm / turn at {step}" for step in steps) + " |",
             "|---|---|---|---|" + "---|" * len(steps)]
    for (data, arm), found in sorted(groups.items()):
        found.sort(key=lambda result: result["seed"] if result["seed"] is not None else -1)
        accuracies = [next(iter(result["accuracy"].values())) for result in found]
        per_seed = " / ".join(f"{a:.4f} (s{r['seed']})" for a, r in zip(accuracies, found))
        curves = []
        for step in steps:
            norm, turn = curve_at(found, "center_norm", step), curve_at(found, "center_turn_deg", step)
            curves.append(f"{norm:.2f} / {turn:.3f} deg" if norm is not None else "-")
        lines.append(f"| {data} | {arm} | {per_seed} | {statistics.mean(accuracies):.4f} | "
                     + " | ".join(curves) + " |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.center_study",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="bench.compare --results files")
    parser.add_argument("--steps", default="50,500,1000", help="steps at which to show the centers' norm and turn")
    args = parser.parse_args(argv)
    try:
        steps = [int(step) for step in args.steps.split(",")]
    except ValueError:
        parser.error(f"--steps {args.steps!r} is not a comma-separated list of step numbers, e.g. 50,500,1000")
    try:
        results = read_results(args.results)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read the results: {error} (bench.compare --results FILE writes them)")
    print("\n".join(table(results, steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmarks of sample_fc on this machine: `python -m bench [--quick] --json OUT`.

    run      the plan (quick/full), the report's parts, the command line (and --worker)
    cases    what a worker measures: the head step by stage, its NumPy bound, the sampler
    jobs     bounded worker processes, the data loader case, the end-to-end train.py run
    report   machine facts, memory model, Markdown tables, targets

Beside it: compare (sample_fc against the yardstick or arcface_torch's own modules:
compare_yardstick its side, time_to_accuracy; center_study its results as one table), step_breakdown,
memory (the memory plan against train.py's measured peaks), yardstick/ (arcface_torch's step), glyphs (real-image data).
"""

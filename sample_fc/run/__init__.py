"""A run's life around the training step: its models root, what was asked, events, stops,
restarts, resume, its layout on a CPU node, and what it will need (memory, GPUs).

    run_request.py   the command line and the restart supervisor's environment, read once
    run_root.py      the models root: its lock, the run id, the run's checkpoints
    run_record.py    the record of an opened run (builder.open_run), taken whole
    run_events.py    per-step events: progress lines, verification, checkpoints, stop requests
    callbacks.py     the progress line, verification and the not-learning watch
    center_probe.py  how the class centers move: their mean norm and turn per step, in the progress records
    stop.py          stop signals: every rank ends the same step, checkpoints, exits
    watchdog.py      a rank with no finished step for too long ends the job; what it is doing; its pauses
    restart.py       the restart supervisor (--max-restarts)
    resume.py        which checkpoint a run resumes from
    launch.py        the launcher behind `python -m sample_fc.launch` (./horovodrun.sh)
    layout.py        the CPU layout (workers on a node) ./horovodrun.sh takes without -np, by measurement
    memory_plan.py   the host and GPU memory a run needs, refused in one line when it cannot fit
    backbone_memory.py  the backbone's part of it, from MXNet's own plan of the bound graph
    gpus.py          the node's GPUs, read without MXNet; the refusal where MXNet cannot run
"""

"""`python -m sample_fc.launch ARGS`: the launcher (sample_fc/run/launch.py), as ./horovodrun.sh runs it."""
import sys

from .run.launch import horovodrun_main

if __name__ == "__main__":
    sys.exit(horovodrun_main())

"""`python -m sample_fc.bench`: see sample_fc/bench/run.py."""
import sys

from .run import main

sys.exit(main())

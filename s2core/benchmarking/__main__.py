"""`python -m s2core.benchmarking ...`: the same as `s2core bench ...`."""

import sys

from .cli import main

sys.exit(main())

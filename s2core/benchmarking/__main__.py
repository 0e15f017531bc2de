"""`python -m s2core.benchmarking ...`: the same as `s2core bench ...`."""

import sys

from s2core.benchmarking.cli import main

sys.exit(main())

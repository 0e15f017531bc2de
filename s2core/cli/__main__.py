import sys

from s2core.cli.main import main

sys.exit(main())

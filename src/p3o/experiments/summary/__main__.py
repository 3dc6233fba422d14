"""``python -m p3o.experiments.summary``: render the results pages from the verdict files."""

import sys

from p3o.experiments.summary.cli import main

sys.exit(main())

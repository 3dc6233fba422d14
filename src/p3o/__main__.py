"""`python -m p3o ...` (and `torchrun -m p3o train ...`)."""

import sys

from p3o.cli import main

sys.exit(main())

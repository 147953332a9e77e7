"""`python -m trainflow.cli` (as torchrun starts each rank: docs/guides/training.md): the `trainflow` command."""

import sys

from trainflow.cli import main

sys.exit(main())

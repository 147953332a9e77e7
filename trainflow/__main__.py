import sys

from trainflow.cli import main

sys.exit(main())

import sys

from specpilot.cli import main

sys.exit(main())

"""``python -m cuscikit``: the command line."""

import sys

from cuscikit.cli import main

if __name__ == "__main__":
    sys.exit(main())

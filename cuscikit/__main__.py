import sys

from cuscikit.cli import main

sys.exit(main())

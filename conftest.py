"""Settings for the tests and for the package's docstring examples (both collected by pytest)."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")  # figures need no screen

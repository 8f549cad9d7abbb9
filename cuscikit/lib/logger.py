"""Logging in PySCF's style: an object's ``verbose`` attribute (0-9) picks what it prints.

Levels follow ``pyscf.lib.logger``: QUIET 0, ERROR 1, WARN 2, NOTE 3, INFO 4, DEBUG 5. Messages
go to Python's `logging` under the ``cuscikit`` logger hierarchy, so an application can route
them anywhere; with no handler configured they are printed to stdout, as PySCF does.

Example:
    >>> from cuscikit.lib.logger import new_logger, NOTE
    >>> class Thing:
    ...     verbose = NOTE
    >>> log = new_logger(Thing(), name="cuscikit.example")
    >>> log.note("converged in %d steps", 12)
    converged in 12 steps
    >>> log.debug("not shown at NOTE")
"""

from __future__ import annotations

import logging
import sys

QUIET, ERROR, WARN, NOTE, INFO, DEBUG = 0, 1, 2, 3, 4, 5
_TO_LOGGING = {
    ERROR: logging.ERROR,
    WARN: logging.WARNING,
    NOTE: 25,
    INFO: logging.INFO,
    DEBUG: logging.DEBUG,
}
logging.addLevelName(25, "NOTE")


class _Stdout(logging.Handler):
    """Prints the bare message to the current ``sys.stdout`` (notebooks replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stdout, flush=True)
        except Exception:  # noqa: BLE001 - a broken stdout must not stop a solver
            self.handleError(record)


_root = logging.getLogger("cuscikit")
if not _root.handlers:
    _h = _Stdout()
    _h.setFormatter(logging.Formatter("%(message)s"))
    _root.addHandler(_h)
    _root.propagate = False
    _root.setLevel(logging.DEBUG)  # each Logger filters by its object's verbose


class Logger:
    """Writes messages of an object at its ``verbose`` level (read at every call, so changing
    ``obj.verbose`` takes effect at once)."""

    def __init__(self, obj=None, name: str = "cuscikit", verbose: int | None = None):
        self._obj, self._verbose = obj, verbose
        self._log = logging.getLogger(name)

    @property
    def verbose(self) -> int:
        if self._verbose is not None:
            return int(self._verbose)
        return int(getattr(self._obj, "verbose", NOTE))

    def _emit(self, level: int, msg: str, *args) -> None:
        if self.verbose >= level:
            self._log.log(_TO_LOGGING[level], msg, *args)

    def error(self, msg: str, *args) -> None:
        self._emit(ERROR, msg, *args)

    def warn(self, msg: str, *args) -> None:
        self._emit(WARN, msg, *args)

    warning = warn

    def note(self, msg: str, *args) -> None:
        self._emit(NOTE, msg, *args)

    def info(self, msg: str, *args) -> None:
        self._emit(INFO, msg, *args)

    def debug(self, msg: str, *args) -> None:
        self._emit(DEBUG, msg, *args)


def new_logger(obj=None, verbose: int | None = None, name: str | None = None) -> Logger:
    """A `Logger` for `obj` (named after its module unless `name` is given)."""
    if name is None:
        name = type(obj).__module__ if obj is not None else "cuscikit"
        if not name.startswith("cuscikit"):
            name = "cuscikit." + name
    return Logger(obj, name=name, verbose=verbose)

"""The ground floor of the Python side: the solver shape every system follows (options as
attributes, ``kernel``/``run``, ``dump_flags``, ``check_sanity``), callbacks and the run loop,
and PySCF-style logging. Nothing here imports another cuscikit package."""

from cuscikit.lib.callbacks import Callback, EarlyStopping, RunLoop, StopRun
from cuscikit.lib.logger import Logger, new_logger
from cuscikit.lib.solver import Solver

__all__ = ["Callback", "EarlyStopping", "Logger", "RunLoop", "Solver", "StopRun", "new_logger"]

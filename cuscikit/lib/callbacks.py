"""Callbacks and the run loop shared by the iterative solvers (NetKet's driver pattern).

A driver (the NNQS `Runner`, a GUGA Davidson, a dSB run) exposes ``step() -> dict`` (one
iteration's history row) and an ``iteration`` counter; `RunLoop` calls it with:

- callbacks: ``on_run_start``, ``on_step_end`` (return True, or raise `StopRun`, to stop after
  this iteration), ``on_run_end`` and ``on_error`` (called with the exception before it
  propagates);
- a progress bar (tqdm, on rank 0 only);
- periodic checkpoints and one at the end;
- Ctrl-C (SIGINT) and SIGTERM: the first signal stops the run after the current iteration,
  so the driver and its checkpoint stay consistent (in a notebook, the kernel's interrupt
  button); a second SIGINT interrupts at once.

On several ranks, ``agree`` (an all-reduce of the stop flag) makes every rank stop together.

Example:
    >>> class Counter:
    ...     iteration = 0
    ...     def step(self):
    ...         self.iteration += 1
    ...         return {"iteration": self.iteration, "e_tot": 1.0 / self.iteration}
    >>> class StopAt3(Callback):
    ...     def on_step_end(self, driver, row):
    ...         return driver.iteration >= 3
    >>> RunLoop(Counter(), [StopAt3()], progress=False).run(10)
    RunStatus(status='stopped', reason='a callback stopped the run', iterations=3)
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np


class StopRun(Exception):
    """Raised by a callback or a step to end the run cleanly after the current iteration."""


class Callback:
    """Base class of run callbacks; every hook is optional."""

    def on_run_start(self, driver) -> None:  # noqa: B027 - optional hook
        pass

    def on_step_end(self, driver, row: dict) -> bool | None:
        """Called after each iteration with its history row; True stops the run."""
        return None

    def on_run_end(self, driver) -> None:  # noqa: B027 - optional hook
        pass

    def on_error(self, driver, exc: BaseException) -> None:  # noqa: B027 - optional hook
        """Called when an iteration raised, before the exception propagates."""


class EarlyStopping(Callback):
    """Stop when ``column`` changed by less than `tol` over the last `patience` iterations.

    Example:
        >>> cb = EarlyStopping(tol=1e-6, patience=5)
    """

    def __init__(self, tol: float = 1e-5, patience: int = 20, column: str = "e_tot"):
        if not (tol >= 0 and math.isfinite(tol)):
            raise ValueError(f"tol must be a finite non-negative number, got {tol}")
        if int(patience) != patience or patience < 1:
            raise ValueError(f"patience must be a positive integer, got {patience}")
        self.tol, self.patience, self.column = float(tol), int(patience), column

    def on_step_end(self, driver, row: dict) -> bool:
        h = driver.history
        if len(h) <= self.patience:
            return False
        window = h[self.column].to_numpy()[-self.patience - 1 :]
        return bool(np.ptp(window) < self.tol)


@dataclass
class RunStatus:
    """How a run ended: "ok" (all iterations), "stopped" (a callback, `StopRun` or a signal
    asked for it after a completed iteration) or "interrupted" (Ctrl-C / SIGTERM)."""

    status: str
    reason: str
    iterations: int

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Signals:
    """SIGINT/SIGTERM → a flag checked between iterations (main thread only; elsewhere the
    default handlers stay). A second SIGINT raises KeyboardInterrupt at once."""

    def __init__(self, announce: Callable[[str], None]):
        self.caught: str | None = None
        self._announce = announce
        self._old: dict = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except (ValueError, OSError):  # pragma: no cover - not the main interpreter
                pass
        return self

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.caught is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.caught = name
        self._announce(
            f"{name} received: stopping after the current iteration "
            + ("(Ctrl-C again to abort at once)" if signum == signal.SIGINT else "")
        )

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class RunLoop:
    """Runs ``driver.step()`` up to n times with callbacks, progress, checkpoints and signals.

    Args:
        driver: has ``step() -> dict`` and ``iteration``.
        callbacks: `Callback` objects (anything with the hooks).
        progress: show a tqdm bar (only where ``rank == 0``).
        desc: the bar's label.
        postfix: row -> dict shown beside the bar.
        checkpoint: called as ``checkpoint()`` every `checkpoint_every` iterations and once
            at the end (None: no checkpoints).
        checkpoint_every: iterations between checkpoints.
        stop_on: exception types a step may raise to end the run cleanly (reason: the message).
        rank: this process's rank (messages and the bar on rank 0).
        agree: flag -> flag on every rank (an all-reduce "max"); None on one process.
        announce: prints a message (default: print on rank 0).
    """

    def __init__(
        self,
        driver,
        callbacks: Iterable = (),
        *,
        progress: bool = True,
        desc: str = "run",
        postfix: Callable[[dict], dict] | None = None,
        checkpoint: Callable[[], None] | None = None,
        checkpoint_every: int = 10,
        stop_on: tuple[type[BaseException], ...] = (),
        rank: int = 0,
        agree: Callable[[bool], bool] | None = None,
        announce: Callable[[str], None] | None = None,
    ):
        if int(checkpoint_every) != checkpoint_every or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive integer, got {checkpoint_every}")
        self.driver, self.callbacks = driver, list(callbacks)
        self.progress, self.desc, self.postfix = progress, desc, postfix
        self.checkpoint, self.checkpoint_every = checkpoint, int(checkpoint_every)
        self.stop_on, self.rank, self.agree = (StopRun, *stop_on), rank, agree
        self.announce = announce or (lambda msg: print(msg) if rank == 0 else None)

    def run(self, n_iter: int) -> RunStatus:
        if int(n_iter) != n_iter or n_iter < 0:
            raise ValueError(
                f"the number of iterations must be a non-negative integer, got {n_iter}"
            )
        driver = self.driver
        for cb in self.callbacks:
            cb.on_run_start(driver)
        bar = None
        if self.progress and self.rank == 0 and n_iter:
            from tqdm.auto import tqdm

            bar = tqdm(total=int(n_iter), desc=self.desc, unit="it", mininterval=1.0)
        status, reason, done, saved_at = "ok", "", 0, None
        try:
            with _Signals(self.announce) as sig:
                for _ in range(int(n_iter)):
                    try:
                        row = driver.step()
                    except self.stop_on as exc:
                        status, reason = "stopped", str(exc)
                        break
                    except BaseException as exc:
                        for cb in self.callbacks:
                            cb.on_error(driver, exc)
                        raise
                    done += 1
                    if bar is not None:
                        if self.postfix is not None:
                            bar.set_postfix(self.postfix(row), refresh=False)
                        bar.update(1)
                    stop, why = False, ""
                    try:
                        if any([bool(cb.on_step_end(driver, row)) for cb in self.callbacks]):
                            stop, why = True, "a callback stopped the run"
                    except StopRun as exc:
                        stop, why = True, str(exc) or "a callback stopped the run"
                    if sig.caught and not stop:
                        stop, why = True, f"{sig.caught} received"
                    if self.agree is not None:
                        stop = bool(self.agree(stop))
                        why = why or "another rank stopped the run"
                    if self.checkpoint is not None and (
                        driver.iteration % self.checkpoint_every == 0 or stop
                    ):
                        self.checkpoint()
                        saved_at = driver.iteration
                    if stop:
                        status = "interrupted" if sig.caught else "stopped"
                        reason = why
                        break
        finally:
            if bar is not None:
                bar.close()
        if (
            self.checkpoint is not None
            and saved_at != driver.iteration
            and (done or status != "ok")
        ):  # a stop saves the consistent state it kept
            self.checkpoint()
        for cb in self.callbacks:
            cb.on_run_end(driver)
        return RunStatus(status, reason, done)

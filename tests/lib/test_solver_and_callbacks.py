"""The solver shape and the run loop shared by every system."""

from __future__ import annotations

import os
import signal

import pandas as pd
import pytest

from cuscikit.lib.callbacks import Callback, EarlyStopping, RunLoop, StopRun
from cuscikit.lib.logger import INFO
from cuscikit.lib.solver import Solver


class Toy(Solver):
    conv_tol = 1e-9
    max_cycle = 50
    _keys = {"e_tot", "converged"}

    def kernel(self):
        self.check_sanity()
        self.e_tot, self.converged = -1.0, True
        return self.e_tot


def test_options_results_and_misspelt_options():
    t = Toy(max_cycle=7)
    assert t.max_cycle == 7 and Toy.max_cycle == 50
    assert t.option_names() == ["conv_tol", "max_cycle", "verbose"]
    assert t.run() is t and t.e_tot == -1.0 and t.converged
    t.conv_tl = 1e-12
    with pytest.raises(AttributeError, match="did you mean 'conv_tol'"):
        t.kernel()
    with pytest.raises(AttributeError, match="no option 'maxcycle'"):
        Toy(maxcycle=3)
    with pytest.raises(AttributeError, match="no option 'kernel'"):
        Toy().set(kernel=3)  # a method is not an option
    t = Toy()
    t._private = 1  # private attributes are the solver's own business
    t.kernel()


def test_subclasses_made_on_the_fly_keep_the_check(capsys):
    """PySCF's wrappers (state_average_, fix_spin_) subclass the solver and add attributes as
    class attributes: they pass the check; a typo on an instance still fails."""
    Wrapped = type("Wrapped", (Toy,), {"weights": (0.5, 0.5)})
    w = Wrapped()
    w.weights = (0.3, 0.7)
    w.kernel()
    Toy(verbose=INFO).dump_flags()
    out = capsys.readouterr().out
    assert "******** Toy ********" in out and "conv_tol = 1e-09" in out
    Toy(verbose=0).dump_flags()
    assert capsys.readouterr().out == ""


class Counter:
    def __init__(self, fail_at=None):
        self.iteration, self.rows, self.fail_at = 0, [], fail_at
        self.saved = []

    @property
    def history(self):
        return pd.DataFrame(self.rows)

    def step(self):
        if self.iteration + 1 == self.fail_at:
            raise RuntimeError("boom")
        self.iteration += 1
        self.rows.append({"iteration": self.iteration, "e_tot": 1.0})
        return self.rows[-1]

    def save(self):
        self.saved.append(self.iteration)


class Record(Callback):
    def __init__(self):
        self.events = []

    def on_run_start(self, driver):
        self.events.append("start")

    def on_step_end(self, driver, row):
        self.events.append(row["iteration"])

    def on_run_end(self, driver):
        self.events.append("end")

    def on_error(self, driver, exc):
        self.events.append(f"error:{exc}")


def test_loop_runs_checkpoints_and_reports():
    d, rec = Counter(), Record()
    status = RunLoop(d, [rec], progress=False, checkpoint=d.save, checkpoint_every=2).run(5)
    assert status.ok and status.iterations == 5
    assert rec.events == ["start", 1, 2, 3, 4, 5, "end"]
    assert d.saved == [2, 4, 5]  # every 2 and once at the end


def test_clean_stops_from_callbacks_and_steps():
    d = Counter()

    class Halt(Callback):
        def on_step_end(self, driver, row):
            if driver.iteration == 3:
                raise StopRun("enough")

    status = RunLoop(d, [Halt()], progress=False, checkpoint=d.save).run(10)
    assert (status.status, status.reason, d.iteration) == ("stopped", "enough", 3)
    assert d.saved == [3]
    d = Counter()
    status = RunLoop(d, [EarlyStopping(tol=1.0, patience=2)], progress=False).run(10)
    assert status.status == "stopped" and d.iteration == 3


def test_error_hook_sees_the_exception():
    d, rec = Counter(fail_at=2), Record()
    with pytest.raises(RuntimeError, match="boom"):
        RunLoop(d, [rec], progress=False).run(5)
    assert rec.events == ["start", 1, "error:boom"]


@pytest.fixture
def python_sigint():
    """SIGINT handled as Python's own default, whatever the test process inherited (a process
    started in the background by a shell without job control starts with SIGINT ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_stops_after_the_current_iteration_and_saves(python_sigint):
    d = Counter()

    class CtrlC(Callback):
        def on_step_end(self, driver, row):
            if driver.iteration == 2:
                os.kill(os.getpid(), signal.SIGINT)  # as a notebook's interrupt button

    status = RunLoop(d, [CtrlC()], progress=False, checkpoint=d.save, checkpoint_every=5).run(9)
    assert status.status == "interrupted" and "SIGINT" in status.reason
    assert d.iteration == 2 and d.saved == [2]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_second_sigint_interrupts_at_once(python_sigint):
    d = Counter()

    class Twice(Callback):
        def on_step_end(self, driver, row):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        RunLoop(d, [Twice()], progress=False).run(5)


def test_bad_loop_arguments():
    with pytest.raises(ValueError, match="checkpoint_every"):
        RunLoop(Counter(), checkpoint_every=0)
    with pytest.raises(ValueError, match="non-negative integer"):
        RunLoop(Counter(), progress=False).run(-1)
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)

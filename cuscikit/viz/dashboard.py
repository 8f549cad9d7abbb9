"""A notebook dashboard over a running solver: start / pause / stop / checkpoint and live panels.

The dashboard is a `cuscikit.lib.Callback`: it acts only between iterations, through the same
`RunLoop` hooks as every other callback, so a pause, a stop or a checkpoint always finds the
driver in a consistent state.

With ipywidgets (the ``[jupyter]`` extra), `Dashboard.show` displays buttons, an iteration
count, a status line and the panels as a picture; Start runs the driver in a background thread,
so the notebook stays responsive and the buttons act while the run goes on (they act whenever
the kernel is idle: a cell that is still running, `wait` included, holds their clicks back).
Without ipywidgets the dashboard degrades to a static matplotlib figure that `start` redraws in
the foreground every `every` iterations (no buttons; the kernel's interrupt stops the run after
the current iteration).

What a front end receives is standard: the widgets are ipywidgets 8 core controls (a widget
view of protocol version 2 with a text fallback; their JavaScript ships with every front end's
widget manager, so nothing is fetched from the network), and the fallback is a plain PNG.
JupyterLab renders them in the browser tests. VS Code's Jupyter extension renders ipywidgets 8
through the same widget manager and controls packages (`@jupyter-widgets/jupyterlab-manager`
5, `@jupyter-widgets/controls` 5) but is not run by the tests.

Runs that are not stepped from outside (a GUGA Davidson solve, a dSB run) have no buttons to
offer; their histories (`davidson_history`, `ising_history`) feed the same panels through
`plot_panels`.

Example (no notebook needed: drive it from code):
    >>> from cuscikit import Ansatz, Molecule, Runner
    >>> mol = Molecule.load("LiH")
    >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), topk=16, seed=0, verbose=0)
    >>> dash = Dashboard(runner, widgets=False)
    >>> dash.start(2).status, runner.iteration
    ('ok', 2)
    >>> sorted(p.name for p in dash.panels())
    ['energy', 'memory', 'space', 'stages', 'teacher']
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence

from cuscikit.lib.callbacks import Callback, RunLoop, RunStatus
from cuscikit.viz.panels import available_panels, plot_panels


def widgets_available() -> bool:
    """Whether ipywidgets can be imported (the ``[jupyter]`` extra)."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _display(obj, handle=None):
    """Show `obj` in IPython (a new display, or an update of `handle`); None outside IPython."""
    if not _in_ipython():
        return None
    from IPython.display import display

    if handle is None:
        return display(obj, display_id=True)
    handle.update(obj)
    return handle


class Dashboard(Callback):
    """Controls and live panels for an iterative driver (a `cuscikit.Runner`, or anything with
    ``step() -> dict``, ``iteration`` and a ``history`` DataFrame).

    Args:
        driver: the run to watch and steer. Its ``run(n, callbacks=..., progress=False)`` is
            used when it has one (the Runner's, with its non-finite-loss handling), otherwise a
            plain `RunLoop`.
        panels: panel names (`cuscikit.viz.PANELS`; default: every panel the history feeds).
        reference: exact energy for the error panel (default: the driver's ``reference``).
        every: redraw the panels every this many iterations.
        checkpoint: file the Checkpoint button writes with ``driver.save`` (None: the button is
            disabled, as it is for drivers without ``save`` and for several ranks, whose saves
            are collective: use ``kernel(checkpoint=...)`` there).
        widgets: True (require ipywidgets), False (static matplotlib) or None (ipywidgets when
            importable).
        title: the figure's title.
        callbacks: more callbacks for every run the dashboard starts (a learning-rate
            schedule, early stopping); they run before the dashboard's own hook.

    The controls are methods too (`start`, `pause`, `resume`, `stop`, `save_checkpoint`,
    `wait`): what the buttons call.
    """

    def __init__(
        self,
        driver,
        panels: Sequence[str] | None = None,
        *,
        reference: float | None = None,
        every: int = 1,
        checkpoint: str | None = None,
        widgets: bool | None = None,
        title: str | None = None,
        callbacks: Sequence = (),
    ):
        if int(every) != every or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        if not (hasattr(driver, "step") and hasattr(driver, "iteration")):
            raise TypeError("the driver needs step() and an iteration counter")
        if widgets is None:
            widgets = widgets_available()
        elif widgets and not widgets_available():
            raise ImportError(
                "the dashboard's controls need ipywidgets: pip install 'cuscikit[jupyter]'"
            )
        self.driver, self.every, self.title = driver, int(every), title
        self.callbacks = list(callbacks)
        self.panel_names = None if panels is None else list(panels)
        self.reference = reference
        self.checkpoint = checkpoint
        self.use_widgets = bool(widgets)
        self.status: RunStatus | None = None
        self.error: BaseException | None = None
        self.message = "ready"
        self.checkpoints: list[tuple[int, str]] = []  # (iteration, path) of every save
        self._resume = threading.Event()
        self._resume.set()
        self._stop = False
        self._want_checkpoint = False
        self._thread: threading.Thread | None = None
        self._active = False
        self._fig = None
        self._handle = None
        self._ui = None
        if self.panel_names is not None:  # unknown names fail now, not mid-run
            from cuscikit.viz.panels import PANELS

            unknown = [n for n in self.panel_names if n not in PANELS]
            if unknown:
                raise ValueError(f"unknown panels {unknown}; choose from {sorted(PANELS)}")

    # ------------------------------------------------------------------------------ state
    @property
    def running(self) -> bool:
        """Whether a run started by `start` is in progress."""
        return self._active

    @property
    def paused(self) -> bool:
        return not self._resume.is_set()

    @property
    def can_checkpoint(self) -> bool:
        return (
            self.checkpoint is not None
            and hasattr(self.driver, "save")
            and not getattr(self.driver, "distributed", False)
        )

    @property
    def history(self):
        return self.driver.history

    def _reference(self) -> float | None:
        if self.reference is not None:
            return self.reference
        return getattr(self.driver, "reference", None)

    def panels(self):
        """The panels the driver's history feeds now."""
        return available_panels(self.history, self.panel_names)

    # ---------------------------------------------------------------------------- drawing
    def figure(self):
        """The panels as a matplotlib figure (redrawn from the current history)."""
        if self._fig is None:  # outside pyplot: shown only through the dashboard's display
            from matplotlib.figure import Figure

            self._fig = Figure()
        n = max(len(self.panels()) if len(self.history) else 1, 1)
        cols = min(n, 2)
        self._fig.set_size_inches(5.2 * cols, 3.2 * -(-n // cols))
        # a Runner's molecule names its energies' unit (t for a Hubbard model)
        unit = getattr(getattr(self.driver, "molecule", None), "energy_unit", "Ha")
        self._fig = plot_panels(
            self.history,
            self.panel_names,
            self._reference(),
            fig=self._fig,
            title=self.title,
            unit=unit,
        )
        return self._fig

    def png(self) -> bytes:
        """The panels as PNG bytes (what the widget shows)."""
        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=80)
        return buf.getvalue()

    def _set_message(self, text: str) -> None:
        self.message = text
        if self._ui is not None:
            self._ui["status"].value = f"<b>{text}</b>"
            self._sync_buttons()

    def refresh(self) -> None:
        """Redraw the panels (widget picture, or the static figure's display)."""
        if self._ui is not None:
            self._ui["image"].value = self.png()
        elif _in_ipython():
            self._handle = _display(self._static(), self._handle)

    def _static(self):
        """The panels as an IPython PNG image: shown by every notebook front end, whether or
        not pyplot's inline backend is active."""
        from IPython.display import Image

        return Image(data=self.png(), format="png")

    # ---------------------------------------------------------------------------- widgets
    def _build(self):
        import ipywidgets as w

        def button(description, icon, tooltip, handler):
            b = w.Button(
                description=description, icon=icon, tooltip=tooltip, layout=w.Layout(width="120px")
            )
            b.on_click(lambda _: handler())
            return b

        ui = {
            "n_iter": w.BoundedIntText(
                value=20, min=1, max=10**7, description="iterations", layout=w.Layout(width="190px")
            ),
            "start": button(
                "Start",
                "play",
                "run the iterations in the background",
                lambda: self.start(self._ui["n_iter"].value),
            ),
            "pause": button(
                "Pause",
                "pause",
                "pause after the current iteration",
                lambda: self.resume() if self.paused else self.pause(),
            ),
            "stop": button("Stop", "stop", "stop after the current iteration", self.stop),
            "checkpoint": button(
                "Checkpoint", "save", "save after the current iteration", self.save_checkpoint
            ),
            "status": w.HTML(f"<b>{self.message}</b>"),
            "image": w.Image(format="png"),
        }
        ui["box"] = w.VBox(
            [
                w.HBox([ui["n_iter"], ui["start"], ui["pause"], ui["stop"], ui["checkpoint"]]),
                ui["status"],
                ui["image"],
            ]
        )
        self._ui = ui
        self._sync_buttons()
        ui["image"].value = self.png()
        return ui["box"]

    def _sync_buttons(self) -> None:
        ui = self._ui
        ui["start"].disabled = self.running
        ui["pause"].disabled = not self.running
        ui["pause"].description = "Resume" if self.paused else "Pause"
        ui["pause"].icon = "play" if self.paused else "pause"
        ui["stop"].disabled = not self.running
        ui["checkpoint"].disabled = not self.can_checkpoint

    def show(self):
        """Display the dashboard (the widgets, or the static figure) and return what was
        displayed (the widget box, or the figure)."""
        if self.use_widgets:
            box = self._ui["box"] if self._ui is not None else self._build()
            _display(box)
            return box
        fig = self.figure()
        if _in_ipython():
            self._handle = _display(self._static(), self._handle)
        return fig

    # ---------------------------------------------------------------------------- control
    def start(self, n_iter: int, background: bool | None = None) -> RunStatus | None:
        """Run `n_iter` more iterations with this dashboard as a callback.

        Args:
            n_iter: iterations to run (fewer if stopped).
            background: run in a thread and return at once (default: with widgets, so that
                the buttons act during the run); otherwise run here and return the status.
        """
        if int(n_iter) != n_iter or n_iter < 1:
            raise ValueError(f"n_iter must be a positive integer, got {n_iter!r}")
        if self.running:
            raise RuntimeError("the dashboard's run is still going: stop it or wait for it")
        if background is None:
            background = self.use_widgets
        self._stop, self._want_checkpoint, self.error, self.status = False, False, None, None
        self._resume.set()
        self._active = True
        if self._ui is not None:  # the box shows what runs, whoever started it
            self._ui["n_iter"].value = int(n_iter)
        if not background:
            self._run(int(n_iter))
            if self.error is not None:
                raise self.error
            return self.status
        self._thread = threading.Thread(
            target=self._run, args=(int(n_iter),), daemon=True, name="cuscikit-dashboard"
        )
        self._thread.start()
        self._set_message(f"running {n_iter} iterations")
        return None

    def _run(self, n_iter: int) -> None:
        driver = self.driver
        try:
            if hasattr(driver, "run") and hasattr(driver, "kernel"):  # a Solver: its own loop
                driver.run(n_iter, callbacks=[*self.callbacks, self], progress=False)
                self.status = getattr(driver, "status", None)
            else:
                loop = RunLoop(driver, [*self.callbacks, self], progress=False)
                self.status = loop.run(n_iter)
        except BaseException as exc:  # noqa: BLE001 - kept for the notebook, re-raised by wait
            self.error = exc
            self._active = False
            self._set_message(f"failed at iteration {driver.iteration + 1}: {exc!r}")
            return
        finally:
            self._resume.set()
            self._active = False
        s = self.status
        how = "finished" if s is None or s.ok else f"{s.status} ({s.reason})"
        self._set_message(f"{how} at iteration {driver.iteration}")

    def pause(self) -> None:
        """Hold the run after the current iteration (until `resume` or `stop`)."""
        self._resume.clear()
        self._set_message(
            f"pausing after iteration {self.driver.iteration + 1}" if self.running else "paused"
        )

    def resume(self) -> None:
        self._resume.set()
        self._set_message("running")

    def stop(self) -> None:
        """End the run after the current iteration (a paused run ends at once)."""
        self._stop = True
        self._resume.set()
        self._set_message("stopping after the current iteration")

    def save_checkpoint(self) -> None:
        """Write ``driver.save(checkpoint)``: between iterations while a run goes on (a paused
        run saves at once), immediately when none does."""
        if not self.can_checkpoint:
            raise RuntimeError(
                "no checkpoint file was given, the driver cannot save, or the run has several "
                "ranks (their saves are collective: use kernel(checkpoint=...))"
            )
        if self.running:
            self._want_checkpoint = True
            self._set_message("checkpoint after the current iteration")
        else:
            self._save()

    def _save(self) -> None:
        self._want_checkpoint = False
        self.driver.save(self.checkpoint)
        self.checkpoints.append((self.driver.iteration, self.checkpoint))
        self._set_message(f"saved iteration {self.driver.iteration} to {self.checkpoint}")

    def wait(self, timeout: float | None = None) -> RunStatus | None:
        """Block until the background run ends (re-raises its error); returns its status."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the run did not end within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.status

    # --------------------------------------------------------------------------- callback
    def on_run_start(self, driver) -> None:
        if self.use_widgets and self._ui is None:
            self._build()

    def on_step_end(self, driver, row: dict) -> bool:
        if driver.iteration % self.every == 0:
            self.refresh()
        if self._want_checkpoint:
            self._save()
        if not self._resume.is_set() and not self._stop:
            self._set_message(f"paused after iteration {driver.iteration}")
            while not self._resume.wait(0.1):
                if self._want_checkpoint:
                    self._save()
            if not self._stop:
                self._set_message("running")
        return self._stop

    def on_run_end(self, driver) -> None:
        self.refresh()

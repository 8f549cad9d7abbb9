"""Convergence plots of NNQS-SCI histories: error against FCI on a log scale."""

from __future__ import annotations

import pandas as pd

from cuscikit.lib.callbacks import Callback
from cuscikit.viz.panels import _draw_energy, in_unit


def plot_convergence(
    history: pd.DataFrame,
    reference: float | None = None,
    ax=None,
    title: str | None = None,
    unit: str = "Ha",
):
    """Plot |E - E_ref| per iteration (log scale) of both estimators, of the PT2-corrected
    energy and of the teacher's CI energy of S where the history has them, with the band of
    chemical accuracy (the energy panel of `cuscikit.viz.panels`), and |S| on a second axis.
    Without a reference, plots the energies instead.

    Args:
        history: `Runner.history` (columns iteration, e_coupled, e_variational, n_space).
        reference: exact energy; default: E = e_tot - error from the history if present.
        ax: matplotlib axes to draw on (default: a new figure).
        title: axes title.
        unit: the energies' unit on the axis ("t" for a Hubbard model, whose energies are in
            units of the hopping).

    Returns:
        The matplotlib axes.

    Example:
        >>> import pandas as pd
        >>> h = pd.DataFrame({"iteration": [1, 2], "e_coupled": [-1.0, -1.1],
        ...                   "e_variational": [-0.9, -1.05], "n_space": [1, 5]})
        >>> ax = plot_convergence(h, reference=-1.101)
        >>> [line.get_label() for line in ax.get_lines()][:2]
        ['coupled estimator', 'variational estimator']
    """
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 4.2))
    _draw_energy(history, ax, reference)
    in_unit(ax, unit)
    ax.set_xlabel("iteration")
    if "n_space" in history:
        ax2 = ax.twinx()
        ax2.plot(history["iteration"].to_numpy(), history["n_space"], color="gray", alpha=0.5, lw=1)
        ax2.set_ylabel("|S|", color="gray")
    if title:
        ax.set_title(title)
    return ax


class LivePlot(Callback):
    """A run callback that redraws the convergence plot in a notebook every `every` steps.

    Example:
        >>> from cuscikit import Ansatz, Molecule, Runner
        >>> mol = Molecule.load("LiH")
        >>> runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), topk=16)
        >>> runner.run(2, callbacks=[LivePlot(every=1)], progress=False).iteration
        2
    """

    def __init__(self, every: int = 5, reference: float | None = None, title: str | None = None):
        if int(every) != every or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.every, self.reference, self.title = int(every), reference, title
        self._handle = None
        self._fig = None

    def on_run_start(self, runner) -> None:
        import matplotlib.pyplot as plt

        self._fig, self._ax = plt.subplots(figsize=(7, 4.2))
        plt.close(self._fig)  # drawn through the display handle only

    def on_step_end(self, runner, row) -> bool:
        if runner.iteration % self.every == 0:
            self.redraw(runner)
        return False

    def on_run_end(self, runner) -> None:
        self.redraw(runner)

    def redraw(self, runner) -> None:
        if self._fig is None:
            self.on_run_start(runner)
        self._fig.clf()
        ax = self._fig.add_subplot(111)
        ref = self.reference if self.reference is not None else runner.reference
        plot_convergence(runner.history, reference=ref, ax=ax, title=self.title)
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            return
        if get_ipython() is None:  # not in a notebook or IPython: nothing to display into
            return
        if self._handle is None:
            self._handle = display(self._fig, display_id=True)
        else:
            self._handle.update(self._fig)

"""Panels over a run's history: one matplotlib drawing per view, chosen by the columns present.

A history is a pandas DataFrame with one row per iteration and an ``iteration`` column. Each
`Panel` names the columns it needs and draws itself on one axes; `available_panels` keeps the
panels a history can feed, so the same code serves every iterative run in the package:

- NNQS-SCI (`cuscikit.Runner.history`): energies of both estimators and with PT2 (and the
  selected-CI teacher's CI energy of S, the best S can hold), |S| and the unique set, seconds
  per stage, the iteration's memory peak, the teacher's pull (its loss, weight and inner
  steps), and the balance of the per-rank loads and of the de-dup (every history has each
  rank's counts; the panel is among the default ones on several ranks);
- a Davidson solve (`davidson_history` records ``callback(iteration, energies, residuals)``):
  energies and residual norms;
- a dSB run (`ising_history` of a `cuscikit.ising.DSBResult`): the lowest replica energy and
  the best so far per step.

`plot_panels` draws the chosen panels on one static figure; `cuscikit.viz.Dashboard` redraws
the same figure live.

Example:
    >>> import pandas as pd
    >>> h = pd.DataFrame({"iteration": [1, 2], "e_coupled": [-1.0, -1.1],
    ...                   "e_variational": [-0.9, -1.05], "n_space": [1, 5],
    ...                   "t_generation": [0.1, 0.2], "t_dedup": [0.01, 0.03]})
    >>> [p.name for p in available_panels(h)]
    ['energy', 'space', 'stages']
    >>> fig = plot_panels(h, reference=-1.101)
    >>> len(fig.axes) >= 3
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

CHEMICAL_ACCURACY = 1.6e-3  # Hartree

# Energy columns, in the order they are drawn: (column, label, line style).
ENERGY_COLUMNS = (
    ("e_coupled", "coupled estimator", "-"),
    ("e_variational", "variational estimator", "--"),
    ("e_tot_pt2", "variational + PT2", "-."),
    ("e_teacher", "CI energy of S (teacher)", ":"),
    ("e_best", "best so far", "-"),
    ("e_min", "lowest replica", ":"),
)
# Columns that start with t_ but are not stages of one iteration (totals, per-rank busy time).
_NOT_STAGES = {"t_total"}
_NOT_STAGE_PREFIX = "t_busy_"
# Per-rank loads: (name, label); a history has ``<name>_r<k>`` per rank k, or only the
# extremes ``<name>_max`` / ``<name>_min``.
_LOADS = (
    ("sources", "sources (S share)"),
    ("coupled", "coupled (generated)"),
    ("unique", "unique (owned after de-dup)"),
    ("received", "de-dup received"),
    ("t_busy", "busy seconds"),
)


def rank_loads(history: pd.DataFrame, name: str) -> np.ndarray | None:
    """The per-rank column ``<name>_r<k>`` of every rank k as an (iterations, ranks) array,
    or None when the history has none.

    Example:
        >>> h = pd.DataFrame({"iteration": [1, 2], "unique_r0": [3, 5], "unique_r1": [4, 5]})
        >>> rank_loads(h, "unique").tolist()
        [[3.0, 4.0], [5.0, 5.0]]
    """
    cols, k = [], 0
    while f"{name}_r{k}" in history:
        cols.append(f"{name}_r{k}")
        k += 1
    return history[cols].to_numpy(dtype=float) if cols else None


def _has_loads(history: pd.DataFrame) -> bool:
    return rank_loads(history, "unique") is not None or (
        "unique_max" in history and "unique_min" in history
    )


def _finite(history: pd.DataFrame, column: str) -> bool:
    return column in history and bool(np.isfinite(history[column].to_numpy(dtype=float)).any())


def energy_columns(history: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The energy columns of `history` that hold a number somewhere, in drawing order; a
    history with none of them but ``e_tot`` (a Davidson solve) gives ``e_tot``."""
    cols = [c for c in ENERGY_COLUMNS if _finite(history, c[0])]
    if not cols and _finite(history, "e_tot"):
        cols = [("e_tot", "energy", "-")]
    return cols


def stage_columns(history: pd.DataFrame) -> list[str]:
    """The per-stage time columns (``t_*`` but not totals or per-rank extremes)."""
    return [
        c
        for c in history.columns
        if c.startswith("t_") and c not in _NOT_STAGES and not c.startswith(_NOT_STAGE_PREFIX)
    ]


def _draw_energy(history: pd.DataFrame, ax, reference: float | None) -> None:
    it = history["iteration"].to_numpy()
    hartree = not _finite(history, "e_best")  # dSB energies are not in Hartree
    if reference is None and hartree and _finite(history, "error") and "e_tot" in history:
        ok = history["error"].notna()
        reference = float((history["e_tot"] - history["error"])[ok].iloc[0])
    for col, label, style in energy_columns(history):
        y = history[col].to_numpy(dtype=float)
        if reference is not None and hartree:
            ax.semilogy(it, np.maximum(np.abs(y - reference), 1e-12), style, label=label)
        else:
            ax.plot(it, y, style, label=label)
    if reference is not None and hartree:
        ax.axhspan(1e-12, CHEMICAL_ACCURACY, color="tab:green", alpha=0.12, lw=0)
        ax.axhline(CHEMICAL_ACCURACY, color="tab:green", ls=":", lw=1, label="chemical accuracy")
        ax.set_ylabel("|E - E_ref| (Ha)")
        # the axis follows the run's own energies: the teacher's CI energy of S may reach the
        # reference exactly (S holds the whole sector) and runs off the bottom there
        own = [c for c, *_ in energy_columns(history) if c != "e_teacher"]
        lo = np.nanmin(
            [np.abs(history[c].to_numpy(float) - reference).min() for c in own or ["e_teacher"]]
        )
        ax.set_ylim(bottom=max(min(lo, CHEMICAL_ACCURACY) / 3, 1e-12))
    else:
        if reference is not None:
            ax.axhline(reference, color="k", lw=0.8, label="reference")
        ax.set_ylabel("energy" if not hartree else "E (Ha)")
    ax.legend(fontsize=7, loc="best")


def in_unit(ax, unit: str) -> None:
    """Relabel an axes drawn in Hartree ("(Ha)" in its y label) in `unit`."""
    ax.set_ylabel(ax.get_ylabel().replace("(Ha)", f"({unit})"))


def _draw_space(history: pd.DataFrame, ax, reference: float | None) -> None:
    it = history["iteration"].to_numpy()
    for col, label in (
        ("n_space", "|S|"),
        ("n_unique", "unique coupled"),
        ("n_coupled", "coupled (with duplicates)"),
    ):
        if col in history:
            ax.semilogy(it, np.maximum(history[col].to_numpy(dtype=float), 1), label=label)
    ax.set_ylabel("configurations")
    ax.legend(fontsize=7, loc="best")


def _draw_stages(history: pd.DataFrame, ax, reference: float | None) -> None:
    cols = stage_columns(history)
    it = history["iteration"].to_numpy()
    ys = [history[c].to_numpy(dtype=float) for c in cols]
    labels = [c[2:] for c in cols]
    if len(it) > 1:
        ax.stackplot(it, ys, labels=labels, alpha=0.85)
    else:  # one iteration: a stacked bar
        bottom = 0.0
        for y, label in zip(ys, labels, strict=True):
            ax.bar(it, y, bottom=bottom, label=label, width=0.6)
            bottom = bottom + y
    ax.set_ylabel("seconds per iteration")
    ax.legend(fontsize=7, loc="upper left", ncols=2)


def _draw_memory(history: pd.DataFrame, ax, reference: float | None) -> None:
    it = history["iteration"].to_numpy()
    ax.plot(
        it, history["peak_memory_bytes"].to_numpy(float) / 2**20, "o-", ms=3, label="measured peak"
    )
    if _finite(history, "peak_theoretical_bytes") and history["peak_theoretical_bytes"].gt(0).any():
        ax.plot(
            it,
            history["peak_theoretical_bytes"].to_numpy(float) / 2**20,
            "--",
            label="theory (pipeline buffers)",
        )
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="best")


def _draw_balance(history: pd.DataFrame, ax, reference: float | None) -> None:
    it = history["iteration"].to_numpy()
    for name, label in _LOADS:
        per_rank = rank_loads(history, name)
        if per_rank is not None:
            top, bottom = per_rank.max(axis=1), per_rank.min(axis=1)
        elif f"{name}_max" in history and f"{name}_min" in history:
            top = history[f"{name}_max"].to_numpy(float)
            bottom = history[f"{name}_min"].to_numpy(float)
        elif name == "received" and "dedup_received_max_min" in history:
            top, bottom = history["dedup_received_max_min"].to_numpy(float), np.ones(len(it))
        else:
            continue
        # undefined while a rank holds nothing (the first iterations of a small S)
        ratio = np.divide(top, bottom, out=np.full_like(top, np.nan), where=bottom > 0)
        ax.plot(it, ratio, ":" if name == "received" else "-", label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("max / min over ranks")
    n = int(history["n_ranks"].iloc[-1]) if "n_ranks" in history else 0
    ax.set_title(f"load balance, {n} rank{'s' if n != 1 else ''} (1 = even)", fontsize=9)
    ax.legend(fontsize=7, loc="best")


def _draw_teacher(history: pd.DataFrame, ax, reference: float | None) -> None:
    """The teacher's loss (how far the network is from the CI vector of S, log axis), its
    weight and the iteration's inner steps (right axis), and where its hold released."""
    it = history["iteration"].to_numpy()
    loss = history["teacher_loss"].to_numpy(float)
    ax.semilogy(it, np.where(loss > 0, loss, np.nan), "-", color="tab:purple", label="loss")
    ax.set_ylabel("fidelity loss")
    right = ax.twinx()
    right.plot(
        it, history["teacher_weight"].to_numpy(float), "--", color="tab:gray", label="weight"
    )
    if "inner_steps" in history:
        right.step(
            it,
            history["inner_steps"].to_numpy(float),
            where="mid",
            color="tab:olive",
            lw=0.8,
            label="inner steps",
        )
    right.set_ylim(bottom=0)  # (no label: the legend names both; a label would leave the axes)
    if "teacher_released" in history and history["teacher_released"].astype(bool).any():
        first = it[int(np.argmax(history["teacher_released"].astype(bool).to_numpy()))]
        ax.axvline(first, color="k", lw=0.8, ls=":", label=f"hold released ({first})")
    lines = ax.get_lines() + right.get_lines()
    ax.legend(lines, [x.get_label() for x in lines], fontsize=7, loc="best")


def _draw_residual(history: pd.DataFrame, ax, reference: float | None) -> None:
    it = history["iteration"].to_numpy()
    ax.semilogy(it, np.maximum(history["residual"].to_numpy(float), 1e-16), "o-", ms=3)
    ax.set_ylabel("largest residual norm")


@dataclass(frozen=True)
class Panel:
    """One view of a history.

    Attributes:
        name: key in `PANELS` (and in `Dashboard(panels=...)`).
        title: the axes title.
        applies: history -> whether this panel has the columns it needs.
        draw: (history, ax, reference) -> None.
        shown_by_default: history -> whether the panel is among the default ones (the balance
            of a single rank is drawn only when asked for by name).
    """

    name: str
    title: str
    applies: Callable[[pd.DataFrame], bool]
    draw: Callable[[pd.DataFrame, object, float | None], None]
    shown_by_default: Callable[[pd.DataFrame], bool] = lambda h: True


PANELS: dict[str, Panel] = {
    p.name: p
    for p in (
        Panel("energy", "energy convergence", lambda h: bool(energy_columns(h)), _draw_energy),
        Panel("space", "|S| and the unique coupled set", lambda h: "n_space" in h, _draw_space),
        Panel("stages", "seconds per stage", lambda h: bool(stage_columns(h)), _draw_stages),
        Panel(
            "memory",
            "peak memory of each iteration",
            lambda h: _finite(h, "peak_memory_bytes"),
            _draw_memory,
        ),
        Panel(
            "teacher",
            "the selected-CI teacher",
            lambda h: _finite(h, "teacher_loss") and "teacher_weight" in h,
            _draw_teacher,
        ),
        Panel(
            "balance",
            "per-rank balance",
            _has_loads,
            _draw_balance,
            shown_by_default=lambda h: "n_ranks" not in h or int(h["n_ranks"].max()) > 1,
        ),
        Panel("residual", "Davidson residual", lambda h: _finite(h, "residual"), _draw_residual),
    )
}


def available_panels(history: pd.DataFrame, names: Iterable[str] | None = None) -> list[Panel]:
    """The panels `history` can feed, in `PANELS` order (or the order of `names`).

    Args:
        history: one row per iteration with an ``iteration`` column.
        names: restrict to these panel names (unknown names raise ValueError); default:
            every panel, less the balance of a single rank.
    """
    if "iteration" not in history:
        raise ValueError("a history needs an 'iteration' column")
    if names is None:
        chosen = [p for p in PANELS.values() if p.shown_by_default(history)]
    else:
        names = list(names)
        unknown = [n for n in names if n not in PANELS]
        if unknown:
            raise ValueError(f"unknown panels {unknown}; choose from {sorted(PANELS)}")
        chosen = [PANELS[n] for n in names]
    return [p for p in chosen if p.applies(history)]


def plot_panels(
    history: pd.DataFrame,
    panels: Sequence[str] | None = None,
    reference: float | None = None,
    fig=None,
    ncols: int = 2,
    title: str | None = None,
    unit: str = "Ha",
):
    """Draw the panels of `history` on one matplotlib figure (a grid, `ncols` wide).

    Args:
        history: one row per iteration (`Runner.history`, `davidson_history`, `ising_history`).
        panels: panel names (default: every panel the history can feed).
        reference: exact energy for the error panel (default: derived from an ``error``
            column when there is one; otherwise energies are drawn as they are).
        fig: a `matplotlib.figure.Figure` to clear and draw on (default: a new pyplot figure,
            which a notebook shows like any other plot).
        ncols: panels per row.
        title: the figure's title.
        unit: the unit of the energies on the axes ("t" for a Hubbard model;
            `Molecule.energy_unit`).

    Returns:
        The figure.
    """
    from matplotlib.ticker import MaxNLocator

    chosen = [] if history.empty else available_panels(history, panels)
    n = max(len(chosen), 1)
    ncols = max(1, min(int(ncols), n))
    nrows = -(-n // ncols)
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(5.2 * ncols, 3.2 * nrows))
    fig.clear()
    # fixed margins: a constrained layout costs a second per redraw on a busy 2-core machine
    top = 1 - (0.75 if title else 0.3) / fig.get_figheight()
    fig.subplots_adjust(
        left=0.09,
        right=0.97,
        bottom=0.55 / fig.get_figheight(),
        top=top,
        wspace=0.3,
        hspace=0.45,
    )
    if not chosen or history.empty:
        ax = fig.add_subplot(111)
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no iterations yet", ha="center", va="center")
    for k, panel in enumerate(chosen):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        panel.draw(history, ax, reference)
        in_unit(ax, unit)
        ax.set_title(ax.get_title() or panel.title, fontsize=9)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def davidson_history() -> tuple[pd.DataFrame, Callable]:
    """A recorder for `cuscikit.linalg.davidson`: returns ``(frame_of, callback)``.

    Pass ``callback`` as davidson's ``callback``; ``frame_of()`` then gives the history (columns
    iteration, e_tot (lowest root), e_root<k> per root, residual (the largest norm)).

    Example:
        >>> import numpy as np
        >>> from cuscikit.linalg import davidson
        >>> a = np.diag(np.arange(1.0, 61.0)); a[0, 1] = a[1, 0] = 0.5
        >>> frame_of, cb = davidson_history()
        >>> _ = davidson(lambda v: a @ v, np.diag(a).copy(), nroots=2, callback=cb)
        >>> h = frame_of()
        >>> [p.name for p in available_panels(h)], bool(h["residual"].iloc[-1] < 1e-5)
        (['energy', 'residual'], True)
    """
    rows: list[dict] = []

    def callback(iteration: int, energies, residuals) -> None:
        e = np.asarray(energies, dtype=float)
        row = {"iteration": int(iteration), "e_tot": float(e[0])}
        row.update({f"e_root{k}": float(v) for k, v in enumerate(e)})
        row["residual"] = float(np.max(residuals))
        rows.append(row)

    return (lambda: pd.DataFrame(rows)), callback


def ising_history(result) -> pd.DataFrame:
    """The history of a `cuscikit.ising.DSBResult` as a frame: one row per scored step
    (restarts one after another), columns iteration, restart, e_min, e_best.

    Example:
        >>> from cuscikit.ising import IsingModel, solve
        >>> m = IsingModel.from_edges(4, [(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 0, 1)])
        >>> h = ising_history(solve(m, agents=4, steps=20, seed=1))
        >>> [p.name for p in available_panels(h)], float(h["e_best"].iloc[-1])
        (['energy'], -4.0)
    """
    h = np.asarray(result.history)
    frame = pd.DataFrame(
        {"restart": h["restart"], "step": h["step"], "e_min": h["e_min"], "e_best": h["e_best"]}
    )
    frame.insert(0, "iteration", np.arange(len(frame)))
    return frame

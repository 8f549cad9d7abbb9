"""Plots and notebook widgets. They read histories and results, never solver internals."""

from cuscikit.viz.convergence import LivePlot, plot_convergence
from cuscikit.viz.dashboard import Dashboard, widgets_available
from cuscikit.viz.panels import (
    PANELS,
    Panel,
    available_panels,
    davidson_history,
    ising_history,
    plot_panels,
    rank_loads,
)

__all__ = [
    "PANELS",
    "Dashboard",
    "LivePlot",
    "Panel",
    "available_panels",
    "davidson_history",
    "ising_history",
    "plot_convergence",
    "plot_panels",
    "rank_loads",
    "widgets_available",
]

"""Plots and notebook widgets. They read histories and results, never solver internals."""

from cuscikit.viz.convergence import LivePlot, plot_convergence

__all__ = ["LivePlot", "plot_convergence"]

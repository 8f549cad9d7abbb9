"""The panels and the dashboard: panel choice by history columns, the static fallback, and the
widget controls (start / pause / checkpoint / resume / stop) driven through their buttons."""

import os
import threading
import time

import numpy as np
import pandas as pd
import pytest

from cuscikit.lib.callbacks import Callback, RunStatus
from cuscikit.viz import Dashboard, available_panels, plot_panels, widgets_available
from cuscikit.viz.panels import CHEMICAL_ACCURACY, energy_columns, stage_columns


def nnqs_like(n=5, pt2=True, ranks=0):
    it = np.arange(1, n + 1)
    h = pd.DataFrame(
        {
            "iteration": it,
            "e_tot": -1.0 - 0.1 * it,
            "e_coupled": -1.0 - 0.1 * it,
            "e_variational": -0.9 - 0.1 * it,
            "e_pt2": -0.01 / it if pt2 else np.nan,
            "e_tot_pt2": (-0.9 - 0.1 * it - 0.01 / it) if pt2 else np.nan,
            "error": 0.1 * (n - it) + 1e-4,
            "n_space": 2**it,
            "n_unique": 10 * 2**it,
            "t_generation": 0.1 * it,
            "t_dedup": 0.05 * it,
            "t_total": 0.2 * it,
            "peak_memory_bytes": 2**20 * it,
            "peak_theoretical_bytes": 2**19 * it,
        }
    )
    if ranks:
        h["n_ranks"] = ranks
        for c in ("sources", "coupled", "unique"):
            h[f"{c}_max"], h[f"{c}_min"] = 11 * it, 10 * it
        h["t_busy_max"], h["t_busy_min"] = 0.2, 0.1
        h["dedup_received_max_min"] = 1.3
    return h


def test_panels_follow_the_columns():
    assert [p.name for p in available_panels(nnqs_like())] == [
        "energy",
        "space",
        "stages",
        "memory",
    ]
    assert "balance" in [p.name for p in available_panels(nnqs_like(ranks=4))]
    # the PT2 curve only where the history has PT2 numbers
    assert "e_tot_pt2" in [c for c, *_ in energy_columns(nnqs_like(pt2=True))]
    assert "e_tot_pt2" not in [c for c, *_ in energy_columns(nnqs_like(pt2=False))]
    davidson = pd.DataFrame({"iteration": [1, 2], "e_tot": [-1.0, -1.2], "residual": [1, 1e-3]})
    assert [p.name for p in available_panels(davidson)] == ["energy", "residual"]
    with pytest.raises(ValueError, match="unknown panels"):
        available_panels(davidson, ["energy", "nope"])
    with pytest.raises(ValueError, match="iteration"):
        available_panels(pd.DataFrame({"e_tot": [1.0]}))


def test_teacher_panel_and_the_ci_energy_of_s():
    """With the teacher's columns: its CI energy of S joins the energy panel (NaN where it was
    not at hand: a gap), and a panel draws its loss, weight, inner steps and the release."""
    h = nnqs_like(n=6)
    assert "teacher" not in [p.name for p in available_panels(h)]
    h["e_teacher"] = [-1.3, -1.35, np.nan, -1.5, -1.6, -1.7]
    h["teacher_loss"] = [0.5, 0.2, 0.1, 0.05, 0.02, np.nan]
    h["teacher_weight"] = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    h["inner_steps"] = [16, 16, 16, 16, 16, 4]
    h["teacher_released"] = [False] * 5 + [True]
    assert [p.name for p in available_panels(h)] == [
        "energy",
        "space",
        "stages",
        "memory",
        "teacher",
    ]
    assert "e_teacher" in [c for c, *_ in energy_columns(h)]
    fig = plot_panels(h, ["energy", "teacher"])
    energy, teacher = fig.axes[0], fig.axes[1]
    ref = float((h["e_tot"] - h["error"]).iloc[0])
    ci = [x for x in energy.get_lines() if x.get_label() == "CI energy of S (teacher)"][0]
    assert np.isnan(ci.get_ydata()[2])
    assert np.allclose(ci.get_ydata()[[0, 1, 3]], np.abs(h["e_teacher"] - ref)[[0, 1, 3]])
    assert teacher.get_yscale() == "log"
    labels = [t.get_text() for t in teacher.get_legend().get_texts()]
    assert labels == ["loss", "hold released (6)", "weight", "inner steps"]
    assert np.allclose(teacher.get_lines()[0].get_ydata()[:5], h["teacher_loss"][:5])


def test_balance_panel_skips_ranks_that_hold_nothing():
    h = nnqs_like(ranks=2)
    h.loc[0, "sources_min"] = 0  # |S| = 1 on two ranks: one of them has no source
    ax = plot_panels(h, ["balance"]).axes[0]
    sources = ax.get_lines()[0].get_ydata()
    assert np.isnan(sources[0]) and np.allclose(sources[1:], 1.1)
    assert ax.get_title() == "load balance, 2 ranks (1 = even)"


def test_balance_panel_reads_each_ranks_counts():
    h = nnqs_like()
    h["n_ranks"] = 3
    for name in ("sources", "coupled", "unique", "received", "t_busy"):
        for k in range(3):
            h[f"{name}_r{k}"] = (k + 1) * h["iteration"]  # rank k carries k + 1 shares
    h.loc[0, "unique_r0"] = 0  # a rank that owns nothing: no ratio
    assert "balance" in [p.name for p in available_panels(h)]
    assert stage_columns(h) == ["t_generation", "t_dedup"]  # busy seconds are not a stage
    ax = plot_panels(h, ["balance"]).axes[0]
    lines = {ln.get_label(): ln.get_ydata() for ln in ax.get_lines()}
    assert set(lines) >= {"sources (S share)", "de-dup received", "busy seconds"}
    assert np.allclose(lines["sources (S share)"], 3.0)
    unique = lines["unique (owned after de-dup)"]
    assert np.isnan(unique[0]) and np.allclose(unique[1:], 3.0)
    one = h[["iteration", "n_space", "sources_r0", "unique_r0"]].assign(n_ranks=1)
    # one rank: drawn when asked for, not among the default panels
    assert "balance" not in [p.name for p in available_panels(one)]
    assert plot_panels(one, ["balance"]).axes[0].get_title() == "load balance, 1 rank (1 = even)"


def test_energy_panel_draws_errors_and_the_accuracy_band():
    h = nnqs_like()
    ref = float((h["e_tot"] - h["error"]).iloc[0])
    fig = plot_panels(h, ["energy"])  # the reference comes from the error column
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:3] == ["coupled estimator", "variational estimator", "variational + PT2"]
    coupled = ax.get_lines()[0].get_ydata()
    assert np.allclose(coupled, np.abs(h["e_coupled"] - ref))
    band = [line for line in ax.get_lines() if line.get_label() == "chemical accuracy"]
    assert band and band[0].get_ydata()[0] == CHEMICAL_ACCURACY
    # no reference at all: energies as they are, linear axis, no band
    fig = plot_panels(h.drop(columns="error"), ["energy"])
    assert fig.axes[0].get_yscale() == "linear"
    assert "chemical accuracy" not in [x.get_label() for x in fig.axes[0].get_lines()]


def test_ising_history_draws_without_the_hartree_band():
    from cuscikit.ising import IsingModel, solve
    from cuscikit.viz import ising_history

    m = IsingModel.from_edges(6, [(i, (i + 1) % 6, 1) for i in range(6)])
    h = ising_history(solve(m, agents=4, steps=30, seed=2, restarts=2))
    assert len(h) == 2 * 31 and h["iteration"].is_monotonic_increasing
    fig = plot_panels(h, reference=-6.0)
    labels = [x.get_label() for x in fig.axes[0].get_lines()]
    assert "chemical accuracy" not in labels and "reference" in labels


class Counter:
    """A driver: step() appends a row; save() records what it saved."""

    def __init__(self, delay=0.0):
        self.iteration, self.rows, self.saved, self.delay = 0, [], [], delay
        self.stepped = threading.Event()

    @property
    def history(self):
        return pd.DataFrame(self.rows)

    def step(self):
        time.sleep(self.delay)
        self.iteration += 1
        row = {
            "iteration": self.iteration,
            "e_tot": -1.0 - 1.0 / self.iteration,
            "n_space": self.iteration,
            "t_generation": 0.01,
        }
        self.rows.append(row)
        self.stepped.set()
        return row

    def save(self, path):
        self.saved.append((self.iteration, path))


def test_static_fallback_runs_in_the_foreground(monkeypatch):
    import cuscikit.viz.dashboard as d

    monkeypatch.setattr(d, "widgets_available", lambda: False)
    drv = Counter()
    dash = Dashboard(drv, every=2)
    assert not dash.use_widgets
    status = dash.start(5)
    assert status == RunStatus("ok", "", 5) and drv.iteration == 5
    assert [p.name for p in dash.panels()] == ["energy", "space", "stages"]
    assert len(dash.show().axes) == 3

    class StopAt7(Callback):
        def on_step_end(self, driver, row):
            return driver.iteration >= 7

    dash = Dashboard(drv, widgets=False, callbacks=[StopAt7()])
    assert dash.start(10) == RunStatus("stopped", "a callback stopped the run", 2)
    with pytest.raises(ImportError, match="ipywidgets"):
        Dashboard(drv, widgets=True)
    with pytest.raises(RuntimeError, match="no checkpoint"):
        dash.save_checkpoint()
    with pytest.raises(ValueError, match="unknown panels"):
        Dashboard(drv, panels=["energy", "dedup"], widgets=False)


def _ipywidgets():
    if not widgets_available():
        if os.environ.get("CI"):
            pytest.fail("ipywidgets is missing on CI; the test extras install it")
        pytest.skip("ipywidgets is missing")


def _until(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_outputs_are_standard_mime_bundles(monkeypatch):
    """What any notebook front end receives (JupyterLab, VS Code's Jupyter extension, ...): an
    ipywidgets 8 widget view (protocol 2) with a text fallback, every model one of the core
    controls (their JavaScript ships with the front end's widget manager, nothing is fetched),
    and without ipywidgets a plain PNG."""
    _ipywidgets()
    drv = Counter()
    drv.step()
    box = Dashboard(drv, widgets=True).show()
    bundle = box._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["version_major"] == 2 and view["model_id"] == box.model_id
    assert "text/plain" in bundle

    def tree(w):
        yield w
        for child in getattr(w, "children", ()):
            yield from tree(child)

    seen = set()
    for w in tree(box):
        assert w._model_module in ("@jupyter-widgets/controls", "@jupyter-widgets/base"), w
        assert w._model_module_version == w._view_module_version == "2.0.0", w
        seen.add(w._model_name)
    assert {"ButtonModel", "BoundedIntTextModel", "HTMLModel", "ImageModel"} <= seen
    assert box.children[2].value[:8] == b"\x89PNG\r\n\x1a\n"  # the panels as a PNG widget

    import cuscikit.viz.dashboard as d

    monkeypatch.setattr(d, "widgets_available", lambda: False)
    static = Dashboard(drv)._static()._repr_mimebundle_()
    static = static[0] if isinstance(static, tuple) else static
    assert list(static) == ["image/png"]


def test_widget_buttons_pause_checkpoint_resume_stop(tmp_path):
    _ipywidgets()
    drv = Counter(delay=0.01)
    path = str(tmp_path / "run.h5")
    dash = Dashboard(drv, ["energy"], checkpoint=path, widgets=True, every=4)
    box = dash.show()  # outside IPython: built, not displayed
    ui = dash._ui
    assert box is ui["box"] and ui["pause"].disabled and not ui["checkpoint"].disabled
    ui["n_iter"].value = 10_000
    ui["start"].click()
    assert dash.running and ui["start"].disabled and not ui["pause"].disabled
    _until(lambda: drv.iteration >= 2)
    ui["pause"].click()
    _until(lambda: dash.message.startswith("paused after iteration"))
    held = drv.iteration
    assert ui["pause"].description == "Resume"
    time.sleep(0.3)
    assert drv.iteration == held  # nothing runs while paused
    ui["checkpoint"].click()  # a paused run saves at once, between iterations
    _until(lambda: drv.saved)
    assert drv.saved == [(held, path)] and dash.checkpoints == [(held, path)]
    ui["pause"].click()  # resume
    _until(lambda: drv.iteration >= held + 2)
    ui["stop"].click()
    status = dash.wait(timeout=20)
    assert status.status == "stopped" and status.iterations == drv.iteration < 10_000
    assert not dash.running and not ui["start"].disabled and ui["stop"].disabled
    assert dash.message.startswith("stopped") and ui["image"].value[:4] == b"\x89PNG"
    # idle: the checkpoint button saves at once; a second run continues the count
    ui["checkpoint"].click()
    assert drv.saved[-1] == (drv.iteration, path)
    before = drv.iteration
    assert dash.start(3, background=False).ok and drv.iteration == before + 3
    assert ui["n_iter"].value == 3  # the box follows a start from code


def test_a_failing_step_is_reported_and_reraised():
    _ipywidgets()

    class Failing(Counter):
        def step(self):
            if self.iteration == 2:
                raise ValueError("boom")
            return super().step()

    dash = Dashboard(Failing(), widgets=True, every=100)
    dash.start(5)
    with pytest.raises(ValueError, match="boom"):
        dash.wait(timeout=20)
    assert "failed at iteration 3" in dash.message and not dash.running


def test_runner_dashboard_checkpoint_resumes(tmp_path):
    """The real Runner under the dashboard: its history feeds the NNQS panels and the
    checkpoint button's file resumes the run."""
    pytest.importorskip("torch")
    from cuscikit import Ansatz, Molecule, Runner

    mol = Molecule.load("LiH")
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), topk=8, seed=0, verbose=0)
    path = str(tmp_path / "lih.h5")
    dash = Dashboard(runner, checkpoint=path, widgets=False)
    assert dash.start(2) == RunStatus("ok", "", 2) and runner.iteration == 2
    dash.save_checkpoint()
    again = Runner(mol, Ansatz.for_molecule(mol, seed=1), topk=8, seed=0, verbose=0).load(path)
    assert again.iteration == 2 and np.array_equal(again.space.configs, runner.space.configs)
    # the default teacher's columns add its panel
    assert [p.name for p in dash.panels()] == ["energy", "space", "stages", "memory", "teacher"]
    h = runner.history  # one rank's loads are in the history too, for the balance panel
    assert (h["n_ranks"] == 1).all() and (h["sources_r0"] == h["n_space"]).all()
    assert (h["unique_r0"] == h["n_unique"]).all() and (h["coupled_r0"] == h["n_coupled"]).all()
    assert (h["received_r0"] >= h["unique_r0"]).all() and (h["t_busy_r0"] > 0).all()
    assert "sources_r1" not in h and len(plot_panels(h, ["balance"]).axes) == 1
    assert again.history.equals(h)  # the checkpoint keeps every column
    assert (runner.history["peak_memory_bytes"] > 0).all()


def test_convergence_plot_draws_the_energy_panel_with_its_unit():
    """`plot_convergence` (the command line's plot) draws the energy panel's curves, the
    PT2-corrected and the teacher's among them, in the unit it is given, with |S| beside."""
    from cuscikit.viz import plot_convergence

    h = nnqs_like(n=4)
    h["e_teacher"] = -1.6
    ax = plot_convergence(h, unit="t", title="ring")
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:4] == [
        "coupled estimator",
        "variational estimator",
        "variational + PT2",
        "CI energy of S (teacher)",
    ]
    assert ax.get_ylabel() == "|E - E_ref| (t)" and ax.get_title() == "ring"
    assert plot_convergence(h).get_ylabel() == "|E - E_ref| (Ha)"
    assert plot_panels(h, ["energy"], unit="t").axes[0].get_ylabel() == "|E - E_ref| (t)"
    assert plot_panels(h.drop(columns="error"), ["energy"], unit="t").axes[0].get_ylabel() == (
        "E (t)"
    )
    assert len(ax.figure.axes) == 2  # |S| on the twin axis


def test_dashboard_labels_a_hubbard_run_in_t():
    pytest.importorskip("torch")
    from cuscikit import Ansatz, Molecule, Runner

    mol = Molecule.hubbard(4, U=4.0, pbc=True)
    runner = Runner(mol, Ansatz.for_molecule(mol, seed=0), seed=0, verbose=0)
    dash = Dashboard(runner, widgets=False)
    dash.start(2)
    assert dash.figure().axes[0].get_ylabel() == "E (t)"

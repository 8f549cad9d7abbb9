"""The notebooks in a real JupyterLab, driven by Playwright in the system's Chromium.

Run by ``bash tools/browser_tests.sh`` (which installs what they need; `.ci/run` calls it after
the test suite), skipped otherwise (``CUSCIKIT_BROWSER_TESTS=1`` turns them on): JupyterLab is
started on the loopback interface with a random token, each notebook is opened in the real UI
and run with Run > Run All Cells at CI's small sizes; the test waits until every code cell has
an execution count, then asserts that no output is an error, that every widget output was
rendered by the widget manager (no "Error displaying widget", no text fallback) and that the
dashboard's buttons and picture are there. A failing notebook leaves a screenshot, the text of
its outputs and JupyterLab's log in ``CUSCIKIT_BROWSER_ARTIFACTS`` (default: the test's
temporary folder); ``CUSCIKIT_BROWSER_KEEP=all`` keeps the screenshots of passing ones too.
``CUSCIKIT_BROWSER_TIMEOUT``: seconds per notebook (default 600, for a loaded 2-core machine).

The browser is the distribution's Chromium (``/usr/bin/chromium``, or ``CUSCIKIT_CHROMIUM``), not
one that Playwright downloads.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SMALL = {
    "CUSCIKIT_NB_ITERS": "4",
    "CUSCIKIT_NB_MOLECULE": "LiH",
    "CUSCIKIT_NB_ENGINES": "2",
}
SMALL_FOR = {"01_": {"CUSCIKIT_NB_MOLECULE": "N2"}}
CHROMIUM = os.environ.get("CUSCIKIT_CHROMIUM", "/usr/bin/chromium")
# Lab settings: every cell in the page (the test reads every prompt), the notebook's kernel
# without a dialog, no news pop-up.
SETTINGS = {
    "@jupyterlab/notebook-extension:tracker": {
        "windowingMode": "none",
        "autoStartDefaultKernel": True,
    },
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},
}
# Markers that an output area holds a Python error (JupyterLab renders them as stderr text).
ERROR_MARKS = ("Traceback (most recent call last)", "Cell In[")
# Markers of a widget output that the widget manager did not render: its error, the
# placeholder of a model that never arrived, tqdm's text fallback without ipywidgets.
WIDGET_FAILURES = ("Error displaying widget", "Loading widget...", "IProgress not found")
# Widget views each notebook shows at least: 01 the dashboard (a box of 5 controls, status,
# picture), 02 and 06 ipyparallel's progress bars while the engines start and run.
WIDGETS_AT_LEAST = {"01_": 5, "02_": 1, "06_": 1}


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _requirements():
    if os.environ.get("CUSCIKIT_BROWSER_TESTS") != "1":
        pytest.skip("run in their own step: bash tools/browser_tests.sh (CUSCIKIT_BROWSER_TESTS=1)")
    missing = [m for m in ("playwright", "jupyterlab", "ipywidgets") if not _importable(m)]
    if not Path(CHROMIUM).is_file():
        missing.append(CHROMIUM)
    if missing:
        pytest.fail(f"browser tests were asked for but {missing} are missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _requirements()
    root = tmp_path_factory.mktemp("lab")
    for nb in NOTEBOOKS:
        shutil.copy(nb, root / nb.name)
    settings = root / ".lab-settings"
    for plugin, values in SETTINGS.items():
        f = settings / (plugin.replace(":", "/") + ".jupyterlab-settings")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, **SMALL, IPYTHONDIR=str(root / ".ipython"))
    env.pop("MPLBACKEND", None)  # the notebooks' inline backend draws the figures
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root by default
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={root / '.workspaces'}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(root / "jupyterlab.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.close()
                pytest.fail("JupyterLab did not start:\n" + (root / "jupyterlab.log").read_text())
            time.sleep(0.5)
    yield {"base": base, "token": token, "root": root}
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _shutdown_sessions(lab) -> None:
    """Shut down every kernel the page started (the next notebook gets the cores)."""
    base, token = lab["base"], lab["token"]
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=30) as r:
        sessions = json.load(r)
    for sess in sessions:
        req = urllib.request.Request(
            f"{base}/api/sessions/{sess['id']}?token={token}", method="DELETE"
        )
        urllib.request.urlopen(req, timeout=60).close()


def _errors(page) -> list[str]:
    texts = page.locator(".jp-OutputArea-output").all_inner_texts()
    return [t for t in texts if any(m in t for m in ERROR_MARKS)]


def _keep(page, lab, path: Path, out: Path, failed: bool) -> None:
    """A failing notebook's screenshot, output texts and the server's log into `out`."""
    try:
        page.screenshot(path=str(out / f"{path.stem}.png"))
        if failed:
            texts = page.locator(".jp-OutputArea-output").all_inner_texts()
            (out / f"{path.stem}-outputs.txt").write_text("\n----\n".join(texts))
    except Exception as exc:  # noqa: BLE001 - a crashed page: say so, keep the log
        (out / f"{path.stem}-screenshot-failed.txt").write_text(repr(exc))
    if failed:
        shutil.copy(lab["root"] / "jupyterlab.log", out / f"{path.stem}-jupyterlab.log")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_jupyterlab(path, lab, browser, tmp_path):
    name = path.name
    nb = lab["root"] / name
    doc = nbformat.read(nb, as_version=4)
    overrides = {}
    for prefix, extra in SMALL_FOR.items():
        if name.startswith(prefix):
            overrides.update(extra)
    if overrides:  # the server's environment is CI's; a per-notebook override goes first
        lines = [f"os.environ[{k!r}] = {v!r}\n" for k, v in overrides.items()]
        doc.cells.insert(0, nbformat.v4.new_code_cell("import os\n" + "".join(lines)))
        nbformat.write(doc, nb)
    n_code = sum(c.cell_type == "code" for c in doc.cells)
    out = Path(os.environ.get("CUSCIKIT_BROWSER_ARTIFACTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    keep_all = os.environ.get("CUSCIKIT_BROWSER_KEEP") == "all"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    t0 = time.monotonic()
    failed, widgets = True, 0
    try:
        # ?reset: a fresh workspace, this notebook the only tab (Run All acts on it)
        page.goto(f"{lab['base']}/lab/tree/{name}?reset&token={lab['token']}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
        try:  # a kernel dialog, where the settings above did not take
            page.get_by_role("button", name="Select", exact=True).click(timeout=5_000)
        except Exception:  # noqa: BLE001 - no dialog
            pass
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000
        )
        page.locator(".jp-NotebookPanel .jp-Cell").first.click()  # the notebook has focus
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        limit = float(os.environ.get("CUSCIKIT_BROWSER_TIMEOUT", "600"))
        while True:
            prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
            done = [p for p in prompts if p.strip().strip("[]:").isdigit()]
            if len(done) == n_code:
                break
            errors = _errors(page)
            assert not errors, f"{name}: error output: {errors[0][:2000]}"
            assert time.monotonic() - t0 < limit, (
                f"{name}: {len(done)} of {n_code} code cells ran within {limit:.0f} s "
                "(CUSCIKIT_BROWSER_TIMEOUT)"
            )
            time.sleep(1.0)
        errors = _errors(page)
        assert not errors, f"{name}: error output: {errors[0][:2000]}"
        texts = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        broken = [m for m in WIDGET_FAILURES if m in texts]
        assert not broken, f"{name}: a widget output was not rendered: {broken}"
        widgets = page.locator(".jp-OutputArea-output .jupyter-widgets").count()
        for prefix, least in WIDGETS_AT_LEAST.items():
            if name.startswith(prefix):
                assert widgets >= least, f"{name}: {widgets} widget views rendered, not {least}"
        if name.startswith("01_"):  # the dashboard's controls, rendered by the widget manager
            for label in ("Start", "Pause", "Stop", "Checkpoint"):
                assert page.get_by_role("button", name=label).count() >= 1, label
            assert page.locator(".jp-OutputArea-output .widget-image").count() >= 1
        images = page.locator(".jp-OutputArea-output img")
        if images.count() and keep_all:  # the first and the last figure in view
            for which, image in (("first", images.first), ("last", images.last)):
                image.scroll_into_view_if_needed()
                page.screenshot(path=str(out / f"{path.stem}-{which}-figure.png"))
        failed = False
    finally:
        _keep(page, lab, path, out if failed or keep_all else tmp_path, failed)
        page.close()
        _shutdown_sessions(lab)
        print(f"{name}: {time.monotonic() - t0:.0f} s in the browser, {widgets} widget views")

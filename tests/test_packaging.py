"""The built wheel ships every module of tensorplay_edu, sub-packages included.

The wheel is built from a copy of the source tree (so no `build/` or `*.egg-info` is left
in the repository) into pytest's tmp_path, offline, with the setuptools of this venv.
The expected file list is read from the source tree, not written down here.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What the build never needs: the venv, git, caches and earlier build outputs.
_NOT_COPIED = shutil.ignore_patterns(".venv", ".git", ".hypothesis", ".pytest_cache", "__pycache__",
                                     "build", "dist", "*.egg-info", ".ipynb_checkpoints")


def _sources(tree):
    """Every .py file of the package under `tree`, as wheel paths (tensorplay_edu/...)."""
    return {p.relative_to(tree).as_posix() for p in (tree / "tensorplay_edu").rglob("*.py")
            if "__pycache__" not in p.parts}


def test_wheel_ships_every_module(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_COPIED)
    out = tmp_path / "wheel"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, f"pip wheel failed:\n{build.stdout}\n{build.stderr}"
    wheels = list(out.glob("tensorplay_edu-*.whl"))
    assert len(wheels) == 1, f"expected one tensorplay_edu wheel in {out}, found {sorted(out.iterdir())}"

    expected = _sources(src)
    assert any(p.startswith("tensorplay_edu/parallel/") for p in expected), "no parallel/ sources found"
    assert any(p.startswith("tensorplay_edu/models/") for p in expected), "no models/ sources found"
    shipped = set(zipfile.ZipFile(wheels[0]).namelist())
    missing = sorted(expected - shipped)
    assert not missing, f"{wheels[0].name} lacks {len(missing)} source files: {missing}"

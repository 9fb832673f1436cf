"""What a user gets from `pip install` of the package, not from a checkout."""

import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_lists_every_package_of_the_source_tree():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lightning_cocod").rglob("__init__.py")
    }
    plugins = {".".join(p.relative_to(ROOT).parts) for p in (ROOT / "hydra_plugins").iterdir() if p.is_dir()}
    assert listed == found | {"lightning_cocod.conf"} | (plugins - {"hydra_plugins.__pycache__"})


def test_lightning_users_get_an_extra_and_the_set_up_names_it():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    tested = next(r for r in extras["test"] if r.startswith("lightning"))
    assert extras["lightning"] == [tested]  # the version the tests ran with
    readme = (ROOT / "README.md").read_text()
    set_up = readme.partition("## Set up and run")[2].partition("\n## ")[0]
    assert 'pip install torch==2.13.0 -e ".[lightning]"' in set_up


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_installed_package_trains_from_an_empty_folder(tmp_path):
    # A copy of what the wheel is built from, so the build leaves nothing in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("lightning_cocod", "hydra_plugins", "conf"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    # The wheel is built with this environment's setuptools (no download) ...
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp_path,
            source,
        ],
        check=True,
        timeout=180,
        capture_output=True,
    )
    # ... and installed in a venv that sees this environment's packages (torch, Lightning, ...),
    # but not this checkout.
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    # --system-site-packages reaches only the base interpreter's packages; when the tests run in a
    # venv themselves (CI), its packages come in as plain path entries. Plain entries, not
    # site.addsitedir: that would run the checkout's editable-install hook and import it instead.
    (venv_site,) = venv.glob("lib/python*/site-packages")
    (venv_site / "test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    (wheel,) = tmp_path.glob("lightning_cocod-*.whl")
    subprocess.run(
        [venv / "bin" / "pip", "install", "-q", "--no-deps", wheel],
        check=True,
        timeout=180,
        capture_output=True,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import lightning_cocod; print(lightning_cocod.__file__)"],
        cwd=empty,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert where.startswith(str(venv)), where
    run = subprocess.run(
        [venv / "bin" / "cocod-train", "experiment=smoke", "run_id=installed", "max_epochs=1"],
        cwd=empty,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert (empty / "outputs" / "smoke" / "installed" / "run.json").is_file()

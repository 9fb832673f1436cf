"""cocod-train's checks in this process: each job of a command line composed with Hydra's compose
API (with Hydra's node, as the app's callback and sweeper get it), then checked as the app does."""

from collections.abc import Sequence

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from lightning_cocod._errors import ConfigError
from lightning_cocod.app.preflight import check_jobs, check_run, config_dir, job_overrides
from lightning_cocod.app.schema import compose_error


def compose_jobs(argv: Sequence[str]) -> tuple[list[list[str]], list[DictConfig]]:
    """The jobs of ``argv`` (``-m`` first for a sweep) and their configs; ConfigError as the app says it."""
    multirun = argv[:1] == ["-m"]
    overrides = list(argv[1:] if multirun else argv)
    try:
        jobs = job_overrides(overrides) if multirun else [overrides]
        with initialize_config_dir(str(config_dir()), version_base="1.3", job_name="train"):
            return jobs, [compose("train", job, return_hydra_config=True) for job in jobs]
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - what Hydra or OmegaConf refused, as main says it
        raise ConfigError(compose_error(err)) from None


def preflight(argv: Sequence[str]) -> list[DictConfig]:
    """What the app checks of ``argv`` before its first job; returns the composed configs."""
    jobs, configs = compose_jobs(argv)
    if len(configs) == 1 and argv[:1] != ["-m"]:
        check_run(configs[0])
    else:
        check_jobs(jobs, configs)
    return configs


def recipe_jobs(recipe: str, cwd, env: dict[str, str], *args: str) -> tuple[list[DictConfig], list[str]]:
    """The jobs a study recipe (``recipes/<recipe>``) runs, printed with DRY_RUN=1, each composed and
    checked as the app does, in the order the app runs them with repeats left out; and the
    arguments of its one ``cocod-report`` command."""
    import os
    import shlex
    import subprocess
    from pathlib import Path

    from lightning_cocod.app.preflight import run_order

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    done = subprocess.run(
        ["bash", str(recipes / recipe), *args],
        cwd=cwd,
        env={**os.environ, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    commands = [shlex.split(line) for line in done.stdout.splitlines()]
    (report,) = [c for c in commands if c[0] == "cocod-report"]
    jobs = []
    for command in (c for c in commands if c[0] == "cocod-train"):
        configs = preflight(["-m", *command[command.index("--multirun") + 1 :]])
        order, repeats = run_order(configs)
        jobs += [configs[n] for n in order if n not in repeats]
    return jobs, report[1:]


def user_module(folder, monkeypatch, name: str, source: str):
    """Writes module ``name`` of the user's own in ``folder`` and makes it importable as the app
    finds it (the current folder); yields the folder and forgets the module after."""
    import sys

    (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield folder
    sys.modules.pop(name, None)

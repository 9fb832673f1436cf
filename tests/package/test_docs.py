"""The documentation cannot rot: the site builds with --strict, every Python block of the README
and of docs/ is run, included from a tested file or marked a sketch, every shell command is run
by a named test or says what it needs, and the API reference covers the public names.
docs/docs-build.md describes the conventions these tests enforce."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NEEDS = ("cluster", "root", "gpu", "network", "long")  # why a command is not run by any test

# Every command a page shows that a test runs (itself, or a miniature with the same program and
# the options that matter), and that test; ".ci/run" runs its command verbatim. A command here
# must be on a page, and a command on a page must be here or carry "# needs: <one of NEEDS>".
COMMANDS_RUN_BY_TESTS = {
    'pip install torch==2.13.0 -e ".[test]" && ruff format --check . && ruff check . && python -m pytest -q -n 2': ".ci/run",
    "pip install torch==2.13.0 -e . && cocod-demo": "tests/tools/test_demo.py::test_small_demo_prints_the_table_and_writes_the_plot",
    "cocod-demo": "tests/tools/test_demo.py::test_small_demo_prints_the_table_and_writes_the_plot",
    "python examples/first_example.py": "tests/app/test_pieces.py::test_the_first_example_trains_two_workers_to_well_above_chance",
    "torchrun --nproc-per-node=2 examples/loop_example.py": "tests/loop/test_examples.py::test_the_plain_pytorch_example_runs_under_torchrun",
    "python examples/fabric_example.py": "tests/loop/test_examples.py::test_the_fabric_example_runs",
    "cocod-plan --workers 16,64 --bandwidth 10gbit --latency 50us --model resnet18 --step-ms 60": "tests/tools/test_plan.py::test_the_command_prints_every_method_and_a_period",
    "cocod-plan --workers 64 --bandwidth 1gbit --step-ms 60 --tau 8 --overlap-steps 1,2,4": "tests/tools/test_plan.py::test_the_command_shows_diloco_overlapped_with_its_last_steps",
    "cocod-train experiment=smoke": "tests/package/test_packaging.py::test_an_installed_package_trains_from_an_empty_folder",
    "cocod-train --cfg job experiment=smoke": "tests/app/test_config.py::test_cfg_job_prints_the_default_config_on_a_machine_without_data",
    "cocod-train --help": "tests/app/test_config.py::test_help_lists_the_groups_and_the_top_level_options",
    "cocod-train -m experiment=smoke strategy=ssgd,cocod,local_sgd tau=2,4,8 seed=0,1,2": "tests/app/test_train.py::test_a_sweep_at_two_links_gives_each_run_the_speedup_over_its_own_links_ssgd",
    "cocod-report outputs --group smoke": "tests/app/test_report.py::test_a_run_finds_its_baseline_among_the_records_of_its_group_and_the_report_marks_late_ones",
    "cocod-train experiment=smoke '~model' +model._target_=mymod.MyModule": "tests/app/test_train.py::test_a_model_and_a_datamodule_of_the_users_own_in_the_current_folder",
    "cocod-train experiment=smoke data._target_=mymod.MyData": "tests/app/test_train.py::test_a_model_and_a_datamodule_of_the_users_own_in_the_current_folder",
    "cocod-train experiment=smoke '~model' +model._target_=mymod.LitModule +model.net._target_=mymod.Net "
    "'+model.optimizer={_target_:torch.optim.SGD,_partial_:true,lr:0.1}'": "tests/app/test_user_code.py::test_a_lightning_module_and_a_data_module_taking_only_batch_size_train_under_the_app",
    "torchrun --nnodes=2 --nproc-per-node=1 --node-rank=0 --master-addr=127.0.0.1 --master-port=29500 -m "
    "lightning_cocod.app.train launcher=torchrun experiment=smoke run_id=two launcher.threads_per_worker=1": "tests/launch/test_multinode.py::test_two_torchrun_agents_run_the_smoke_experiment_on_cpu",
    "cocod-train experiment=smoke run_id=<the run's id> checkpoint.resume=last": "tests/app/test_train.py::test_a_preempted_run_resumes_with_the_one_command_it_prints",
    "mkdocs build --strict": "tests/package/test_docs.py::test_the_site_builds_with_strict_warnings_as_errors",
}
# How a test names the program a command runs, besides its own name.
PROGRAM_ALIASES = {
    "cocod-demo": ("lightning_cocod.tools.demo",),
    "cocod-plan": ("tools.plan", "tools import plan"),
    "cocod-train": ("lightning_cocod.app.train",),
    "cocod-report": ("report.main", "app import report"),
    "torchrun": ("torch.distributed.run",),
}


def fences(text: str):
    """(info string, body lines, line number) of every fenced block, indented ones (in a list
    item) included."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        match = re.match(r"^(\s*)(`{3,})(.*)$", lines[i])
        if not match:
            i += 1
            continue
        indent, ticks, info = match.groups()
        if "`" in info:  # inline code at the start of a line, not a fence (CommonMark's rule)
            i += 1
            continue
        body, start = [], i + 1
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[i]):
            body.append(lines[i].removeprefix(indent))
            i += 1
        found.append((info.strip(), body, start))
        i += 1
    return found


def indented_code_lines(text: str) -> list[int]:
    """Line numbers of indented code blocks (4 spaces after a blank line, outside fences and list
    items): commands there would escape the checks, so pages use fences only."""
    found, in_fence, previous_blank, in_list = [], False, True, False
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*`{3,}[^`]*$", line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if line.strip() and not line.startswith(" "):
            in_list = bool(re.match(r"^(\s*[-*+]|\s*\d+\.)\s", line))
        if line.startswith("    ") and line.strip() and previous_blank and not in_list:
            found.append(number)
        previous_blank = not line.strip()
    return found


def snippet_paths(body: list[str]) -> list[str] | None:
    """The files a block includes (``--8<-- "path"``), or None when it holds anything else."""
    paths = [re.fullmatch(r'--8<-- "([^"]+)"', line.strip()) for line in body if line.strip()]
    return [m.group(1) for m in paths] if paths and all(paths) else None


def _test_files_naming(name: str) -> list[Path]:
    return [p for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs.py" and name in p.read_text()]


def python_problems(page: Path, root: Path = ROOT) -> tuple[list[str], list[tuple[str, str]]]:
    """Problems with the page's Python blocks, and its runnable blocks as (id, code)."""
    problems, runnable = [], []
    examples = {p.read_text(): p for p in (root / "examples").glob("*.py")}
    where = page.relative_to(root)
    for info, body, line in fences(page.read_text()):
        if not info.startswith("python"):
            continue
        code = "\n".join(body) + "\n"
        if 'title="sketch' in info:
            continue
        included = snippet_paths(body)
        copy_of = examples.get(code)
        titled = re.fullmatch(r'python title="(examples/[^"]+)"', info)
        if titled and (copy_of is None or str(copy_of.relative_to(root)) != titled.group(1)):
            problems.append(
                f"{where}:{line}: titled {titled.group(1)} but differs from that file: copy it again"
            )
            continue
        if included is not None or copy_of is not None:
            for path in included or [str(copy_of.relative_to(root))]:
                if not path.startswith("examples/") or not (root / path).is_file():
                    problems.append(f"{where}:{line}: includes {path}, which is not a file under examples/")
                elif not _test_files_naming(Path(path).name):
                    problems.append(f"{where}:{line}: includes {path}, which no test runs")
            continue
        if info != "python":
            problems.append(
                f'{where}:{line}: unknown python fence {info!r}: use ```python or ```python title="sketch"'
            )
            continue
        runnable.append((f"{where}:{line}", code))
    return problems, runnable


def commands(text: str) -> list[tuple[str, int]]:
    """Every command of the page's shell blocks, continuations joined, with its line number; a
    command covered by a block-wide ``# needs:`` line gets that comment appended."""
    found = []
    for info, body, start in fences(text):
        if info.split(" ")[0] not in ("bash", "console", "sh", "shell"):
            continue
        first = next((b.strip() for b in body if b.strip()), "")
        block_needs = first if re.match(r"^# needs: ", first) else ""
        pending, pending_line = "", 0
        for offset, raw in enumerate(body):
            line = raw.strip()
            if info.startswith("console"):
                if not line.startswith("$ ") and not pending:
                    continue  # output
                line = line.removeprefix("$ ")
            if not pending and (not line or line.startswith("#")):
                continue
            if not pending:
                pending_line = start + offset + 1
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip() + " "
                continue
            found.append((f"{pending}  {block_needs}" if block_needs else pending, pending_line))
            pending = ""
    return found


def command_problem(command: str) -> str | None:
    """None when the command is run by a test or says what it needs; else what is wrong."""
    needs = re.search(r"#\s*needs:\s*([\w-]+)", command)
    if needs:
        return None if needs.group(1) in NEEDS else f"needs {needs.group(1)!r}: not one of {NEEDS}"
    bare = re.sub(r"\s+#.*$", "", command).strip()
    if bare not in COMMANDS_RUN_BY_TESTS:
        return "no test runs it (COMMANDS_RUN_BY_TESTS) and it has no '# needs: ...' comment"
    return None


def runner_problem(command: str, runner: str) -> str | None:
    """None when ``runner`` (a test, or .ci/run) exists and runs the command's program."""
    if runner == ".ci/run":
        ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")  # quiet, the same
        return None if command in ci else ".ci/run does not run it"
    path, _, name = runner.partition("::")
    source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
    if not re.search(rf"^\s*def {re.escape(name)}\(", source, re.MULTILINE):
        return f"{runner} does not exist"
    words = [w for w in command.split("&&")[-1].split() if "=" not in w or w.startswith("-")]
    program = words[0]
    if program == "python" and len(words) > 1:
        program = Path(words[1]).name  # the script the test runs
    if not any(name in source for name in (program, *PROGRAM_ALIASES.get(program, ()))):
        return f"{runner} never names {program}"
    return None


def all_python_blocks():
    return [block for page in PAGES for block in python_problems(page)[1]]


@pytest.mark.timeout(240)
def test_the_site_builds_with_strict_warnings_as_errors(tmp_path):
    # A broken link or anchor, a page outside the nav, a missing include or an unreadable
    # docstring is a warning, and --strict makes it an error. No network is needed.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=tmp_path,  # another folder than the repository's: the snippets' base path is the config's
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        stdin=subprocess.DEVNULL,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    front = (site / "index.html").read_text()
    assert (
        "the shortest period that hides each round, at most 2" in front
    )  # a comment of examples/first_example.py, which the page holds
    reference = (site / "reference" / "index.html").read_text()
    assert "Computation and communication decoupled SGD" in reference  # CoCoDStrategy's docstring


def test_the_snippets_base_path_is_the_repository_root_from_any_folder(tmp_path, monkeypatch):
    from mkdocs.config import load_config

    monkeypatch.chdir(tmp_path)
    config = load_config(str(ROOT / "mkdocs.yml"))
    assert [Path(os.fspath(p)) for p in config.mdx_configs["pymdownx.snippets"]["base_path"]] == [ROOT]


def test_the_pages_hold_their_code_rather_than_include_it():
    # Read in the repository (GitHub renders no includes), a page must show the code itself.
    includes = [
        f"{page.relative_to(ROOT)}:{line}"
        for page in PAGES
        for info, body, line in fences(page.read_text())
        if any("8<" in b or "8 <" in b for b in body)
    ]
    assert includes == []
    shown = {
        m.group(1)
        for page in PAGES
        for m in re.finditer(r'```python title="(examples/[^"]+)"', page.read_text())
    }
    assert {"examples/loop_example.py", "examples/gpt_loop_example.py", "examples/fabric_example.py"} <= shown


def test_every_python_block_is_run_included_from_a_tested_file_or_a_sketch():
    problems = [p for page in PAGES for p in python_problems(page)[0]]
    assert not problems, "\n".join(problems)
    assert all_python_blocks(), "no runnable block found: the parser is broken"


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("where", "code"), all_python_blocks(), ids=[w for w, _ in all_python_blocks()])
def test_runnable_python_blocks_run(where, code):
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, f"{where}:\n{done.stderr[-3000:]}"


def test_every_shell_command_is_run_by_a_test_or_says_what_it_needs():
    problems, shown = [], set()
    for page in PAGES:
        text = page.read_text()
        for number in indented_code_lines(text):
            problems.append(f"{page.relative_to(ROOT)}:{number}: an indented code block; use a ```bash fence")
        for command, line in commands(text):
            shown.add(re.sub(r"\s+#.*$", "", command).strip())
            problem = command_problem(command)
            if problem:
                problems.append(f"{page.relative_to(ROOT)}:{line}: {command!r}: {problem}")
    for command, runner in COMMANDS_RUN_BY_TESTS.items():
        problem = runner_problem(command, runner)
        if problem:
            problems.append(f"{command!r}: {problem}")
        if command not in shown:
            problems.append(f"{command!r} is in COMMANDS_RUN_BY_TESTS but no page shows it any more")
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path):
    # Each check, on a page made to fail it.
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\ncocod-train experiment=nothing\nrecipes/x.sh  # needs: gpu\n```\n\n"
        "Text.\n\n    indented --command\n\n"
        '```python\nprint(1)\n```\n\n```python title="sketch"\nfit(model)\n```\n\n'
        '```python\n--8<-- "examples/missing.py"\n```\n\n```python title="other"\nx\n```\n'
        '\n```python title="examples/first_example.py"\nprint("not the file")\n```\n'
    )
    text = page.read_text()
    unaccounted = [c for c, _ in commands(text) if command_problem(c)]
    assert unaccounted == ["cocod-train experiment=nothing"]
    assert command_problem("sbatch job.sh  # needs: luck") is not None
    assert indented_code_lines(text) == [8]
    problems, runnable = python_problems(page, root=tmp_path)
    assert [code for _, code in runnable] == ["print(1)\n"]
    assert (
        len(problems) == 3 and "examples/missing.py" in problems[0] and "unknown python fence" in problems[1]
    )
    assert "differs from that file" in problems[2]
    assert runner_problem("cocod-report x", "tests/app/test_report.py::test_no_such_test") is not None
    assert runner_problem(
        "cocod-demo", "tests/tools/test_plan.py::test_the_command_prints_every_method_and_a_period"
    )


def lists_without_a_blank_line(text: str) -> list[int]:
    """Line numbers of list items that follow a paragraph line directly: GitHub renders them as a
    list, but the site's Markdown (Python-Markdown) runs them into the paragraph as raw "- "."""
    found, in_fence, previous = [], False, ""
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*`{3,}[^`]*$", line):
            in_fence = not in_fence
        elif (
            not in_fence
            and re.match(r"^(- |\d+\. )", line)
            and previous.strip()
            and not re.match(r"^(\s|- |\d+\. |\|)", previous)
        ):
            found.append(number)
        previous = line
    return found


def test_every_list_starts_after_a_blank_line():
    assert lists_without_a_blank_line("Text:\n- an item\n\nText:\n\n- an item\n- another\n") == [2]
    problems = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in PAGES[1:]
        for n in lists_without_a_blank_line(page.read_text())
    ]
    assert not problems, "a list right after a paragraph line renders as raw text on the site: " + ", ".join(
        problems
    )


def test_the_readme_is_short_and_keeps_the_two_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "pip install torch==2.13.0 -e . && cocod-demo\n" in readme
    test_command = 'pip install torch==2.13.0 -e ".[test]" && ruff format --check . && ruff check . && python -m pytest -q -n 2'
    assert test_command + "\n" in readme and runner_problem(test_command, ".ci/run") is None
    # The first example, shown whole: the file the test runs.
    assert (ROOT / "examples" / "first_example.py").read_text() in readme


def test_the_headline_is_short_and_its_figures_are_the_documented_ones():
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Headline result\n(.*?)(?=^## )", readme, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no '## Headline result' section followed by another section"
    lines = section.group(0).splitlines()
    assert len(lines) <= 40
    documented = "\n".join(p.read_text() for p in PAGES[1:])
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("|---")]
    assert rows, "the headline has a table"
    missing = [row for row in rows if row not in documented]
    assert not missing, "headline rows that no page of docs/ holds (with their provenance):\n" + "\n".join(
        missing
    )


def test_the_readme_links_and_images_point_at_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [t.partition("#")[0] for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
    assert local, "the README links its documentation"
    assert [t for t in local if not (ROOT / t).exists()] == []


@pytest.mark.parametrize(
    ("module", "page"),
    [
        ("lightning_cocod", "index.md"),
        ("lightning_cocod.callbacks", "callbacks.md"),
        ("lightning_cocod.data", "data.md"),
        ("lightning_cocod.models", "models.md"),
        ("lightning_cocod.core", "core.md"),
        ("lightning_cocod.rounds", "rounds.md"),
    ],
)
def test_the_api_reference_has_every_public_name(module, page):
    text = (ROOT / "docs" / "reference" / page).read_text()
    missing = [
        name
        for name in public_names(module)
        if not re.search(rf"^::: [\w.]+\.{name}$|^      heading: \"{name}\"$", text, re.MULTILINE)
    ]
    assert not missing, f"docs/reference/{page} lacks {missing}"


def test_the_loop_reference_lists_every_loop_class():
    loops = re.findall(
        r"^class (\w+)\(_RoundsLoop\)", (ROOT / "lightning_cocod" / "loop.py").read_text(), re.MULTILINE
    )
    text = (ROOT / "docs" / "reference" / "loop.md").read_text()
    assert loops and [name for name in loops if f'"{name}"' not in text] == []


def public_names(module: str) -> list[str]:
    """The module's ``__all__``, read from its source: importing Lightning takes minutes on a
    loaded 2-core machine, and the names are all the test needs."""
    source = ROOT / module.replace(".", "/") / "__init__.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{source} has no __all__")

"""What users copy shows what they should write: the examples and the docs' sketches use the
settings the README recommends (tau="auto" for SGD, progress at tau=1 for AdamW), or say why not;
the pages a user lands on say what to write before the evidence; the demo's figures carry their
conditions."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# The pages whose code users copy into their own loops and Lightning scripts.
SKETCH_PAGES = [ROOT / "docs" / "loops-and-fabric.md", ROOT / "docs" / "language-model.md"]
LANDING_PAGES = [*SKETCH_PAGES, ROOT / "docs" / "app.md"]
CALL = re.compile(r"\b(CoCoD|CoCoDStrategy|CoCoDFabricStrategy)\(([^()]*(?:\([^()]*\)[^()]*)*)\)")


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python[^\n]*\n(.*?)```", page.read_text(), re.DOTALL)


def problems_of(where: str, code: str) -> list[str]:
    """Each CoCoD-SGD constructed in ``code`` with a fixed period above tau="auto"'s bound, or
    without the outer step in code that trains with AdamW."""
    found = []
    for match in CALL.finditer(code):
        args = match.group(2)
        tau = re.search(r"\btau=(\d+)", args)
        if tau and int(tau.group(1)) > 2:
            found.append(f"{where}: {match.group(0)}: a period above 2, which costs accuracy")
        if "AdamW(" in code and "progress=" not in args:
            found.append(f"{where}: {match.group(0)}: AdamW without progress")
    return found


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_example_uses_the_recommended_settings(example):
    code = example.read_text()
    assert problems_of(example.name, code) == []
    if "AdamW(" in code and "CoCoD(" in code:  # progress above 1 holds at tau=1 only
        assert re.search(r"CoCoD\([^\n]*\btau=1\b[^\n]*progress=", code), code


def test_the_sketches_and_inline_code_of_the_pages_use_the_recommended_settings():
    problems = []
    for page in SKETCH_PAGES:
        for n, block in enumerate(python_blocks(page)):
            problems += problems_of(f"{page.name} block {n}", block)
        inline = " ".join(
            re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL))
        )
        problems += problems_of(f"{page.name} (text)", inline)
    assert problems == []


def test_the_demo_says_why_it_keeps_a_fixed_period():
    from lightning_cocod.tools import demo

    args = demo.parse_args([])
    assert args.tau > 2  # the demo compares at one fixed period on a slow link
    source = (ROOT / "lightning_cocod" / "tools" / "demo.py").read_text()
    help_text = re.search(r'"--tau",(.*?)\)', source, re.DOTALL).group(1)
    assert 'recommended tau="auto"' in help_text and "cost accuracy" in help_text


def sections(page: Path) -> list[tuple[str, str]]:
    """(heading, prose) of each ``## `` section, fenced code left out."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2]))


def test_the_loops_page_says_what_to_write_first_with_adamw_too():
    page = ROOT / "docs" / "loops-and-fabric.md"
    heading, _ = sections(page)[0]
    assert heading == "What to write"
    first = page.read_text().partition("## What to write")[2].partition("\n## ")[0]
    assert "AdamW" in first and "progress=" in first and "CoCoD(model, optimizer).start()" in first


@pytest.mark.parametrize("page", LANDING_PAGES, ids=[p.name for p in LANDING_PAGES])
def test_test_names_come_after_what_to_write_in_a_last_section_of_their_own(page):
    found = sections(page)
    assert found[-1][0] == "How this is checked"
    assert [heading for heading, prose in found[:-1] if "tests/" in prose] == []


def test_the_demos_figures_say_under_what_conditions_and_how_they_spread():
    performance = (ROOT / "docs" / "performance.md").read_text()
    main_job = performance.partition("## Main job")[2].partition("\n## ")[0]
    assert "3.04x" in main_job
    # Beside the figure: the machine's state when measured, and what other runs gave.
    assert re.search(r"idle", main_job) and re.search(r"busy|loaded", main_job)
    assert re.search(r"\d\.\d\dx.{0,40}(to|-|–).{0,40}\d\.\d\dx", main_job), main_job
    index = (ROOT / "docs" / "index.md").read_text()
    claim = index[index.index("`cocod-demo` trains") :].partition("\n\n")[0]
    assert "three times faster" not in claim and "performance.md" in claim

"""The documentation holds together: every relative link of README.md and docs/*.md reaches a file and, with
`#anchor`, a heading of that file (GitHub's anchors); every docs page is listed in the README; and the README
stays an overview (under 300 lines), the reference living in docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (neither holds links or headings)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file, repeated headings numbered as GitHub numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", path.read_text(encoding="utf-8")), re.M):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not ours to check


def test_the_slug_follows_github():
    assert slug("Loading, dtypes and devices") == "loading-dtypes-and-devices"
    assert slug("How `--model` is resolved") == "how---model-is-resolved"
    assert slug("DeBERTa's attention") == "debertas-attention"
    assert slug("Python API") == "python-api"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    assert page.exists()
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        destination = (page.parent / file).resolve() if file else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (destination.suffix != ".md" or anchor not in anchors(destination)):
            broken.append(f"{target}: no heading with the anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_listed_in_the_readme_and_opens_with_its_title():
    readme_links = set(links(ROOT / "README.md"))
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme_links, f"README.md does not link docs/{page.name}"
        lines = page.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2] and not lines[2].startswith("#"), (
            f"docs/{page.name} should open with its title and a summary paragraph")


def test_the_readme_stays_an_overview():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines: move reference text to docs/"


WRONG_CONTROL_VECTOR = re.compile(r"--control-vector[ =]+\S*:")  # llama.cpp reads `FILE:N` as a file name there


def test_llama_cpp_is_shown_its_scaled_option():
    """llama.cpp's `--control-vector` takes a file alone: `--control-vector happy.gguf:8` fails to open
    'happy.gguf:8' and generates unsteered. A strength goes with `--control-vector-scaled FILE:STRENGTH`; no page, and
    no help text of the package, shows the other form (issue 51, item 4)."""
    sources = [*PAGES, *sorted((ROOT / "tfcli").rglob("*.py"))]
    wrong = [f"{path.relative_to(ROOT)}: {match.group(0)}" for path in sources
             for match in WRONG_CONTROL_VECTOR.finditer(path.read_text(encoding="utf-8"))]
    assert not wrong, "; ".join(wrong)
    assert "--control-vector-scaled happy.gguf:8 --control-vector-layer-range 14 22" in (
        ROOT / "docs" / "steering.md").read_text(encoding="utf-8")


def test_the_readme_says_what_helps_a_slow_torch_command():
    """Under load a torch command can run many times slower: the README says so and names OMP_NUM_THREADS, not only
    docs/errors.md (issue 51, item 9)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Quick start")
    quick_start = readme[start:readme.index("## Commands", start)]
    assert re.search(r"many times slower.*`OMP_NUM_THREADS=1`", " ".join(quick_start.split()))

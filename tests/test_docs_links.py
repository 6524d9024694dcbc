"""The README and docs/ point at things that exist: every relative link's file and heading, every docs/*.md page named
in prose, and one "Where next" line per page of docs/ (the README is an entry page; the rest lives there)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
NAMED = re.compile(r"\bdocs/([\w.-]+\.md)\b")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_relative_link_and_named_page_exists():
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
        for name in NAMED.findall(text):
            if not (ROOT / "docs" / name).exists():
                broken.append(f"{page.name}: docs/{name}")
    assert not broken, broken


def test_the_readme_gives_one_line_to_every_page_of_docs():
    readme = (ROOT / "README.md").read_text()
    where_next = readme[readme.index("## Where next") :]
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"- [docs/{page.name}](docs/{page.name}):" in where_next, page.name

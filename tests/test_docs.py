"""The docs hold together: every relative link in README.md and docs/*.md
names a file of the repository (and a heading of it, for ``#anchor``), and no
doc cites a path outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)


def _text(path: Path) -> str:
    return _FENCE.sub("", path.read_text())  # links in code blocks are code


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|__?", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _text(path).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for m in _LINK.finditer(_text(path))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not checked here
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists() or REPO not in [dest, *dest.parents]:
            broken.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading #{anchor}")
    assert not broken, f"{doc.relative_to(REPO)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_doc_cites_a_path_outside_the_repository(doc):
    text = doc.read_text()
    outside = re.findall(r"(?<![\w.])(?:/work/\S*|shared/\S*|DESIGN\.md)", text)
    assert not outside, f"{doc.relative_to(REPO)} cites {outside}"


_SECTION_IN = re.compile(r"\[[^\]]*\]\(([\w./-]+\.md)\),? \"([^\"]+)\"")
_SECTION_HERE = re.compile(r"\"([^\"]+)\" (?:below|above)")


def headings(path: Path) -> list[str]:
    return [m.group(1).lower() for m in re.finditer(r"^#{1,6}\s+(.*)$", _text(path), re.MULTILINE)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_section_named_exists(doc):
    """``([X.md](X.md), "Section")`` and ``"Section" below``: X.md (or this doc) has that heading."""
    text = _text(doc)
    wanted = [(doc.parent / f, title) for f, title in _SECTION_IN.findall(text)]
    wanted += [(doc, title) for title in _SECTION_HERE.findall(text)]
    missing = [
        f"{dest.name}: {title!r}"
        for dest, title in wanted
        if not dest.exists() or not any(title.lower() in h for h in headings(dest))
    ]
    assert not missing, f"{doc.relative_to(REPO)} names sections that do not exist: {missing}"


def test_the_anchor_rules():
    assert slug('Spark idioms: `format("castsql")`') == "spark-idioms-formatcastsql"
    assert slug("3.2 Version 2 manifests") == "32-version-2-manifests"

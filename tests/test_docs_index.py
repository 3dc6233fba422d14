"""The documentation's front doors: the README stays short, and every doc page is reachable from an index."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def links(page: Path) -> set[Path]:
    """The local files `page` links to, resolved."""
    text = page.read_text(encoding="utf-8")
    return {(page.parent / m).resolve() for m in LINK.findall(text) if "://" not in m}


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/ (its index: docs/README.md)"
    assert (DOCS / "README.md").resolve() in links(ROOT / "README.md"), "README.md must link the docs index"


def test_every_doc_page_is_linked_from_an_index() -> None:
    indexed = links(DOCS / "README.md") | links(DOCS / "results" / "README.md")
    pages = [p for p in DOCS.rglob("*.md") if p.name != "README.md"]
    missing = sorted(str(p.relative_to(ROOT)) for p in pages if p.resolve() not in indexed)
    assert not missing, f"pages no index links (docs/README.md or docs/results/README.md): {missing}"


def test_local_links_resolve() -> None:
    pages = [ROOT / "README.md", *DOCS.rglob("*.md")]
    broken = [
        f"{page.relative_to(ROOT)} -> {target}" for page in pages for target in links(page) if not target.exists()
    ]
    assert not broken, "broken links:\n" + "\n".join(sorted(broken))

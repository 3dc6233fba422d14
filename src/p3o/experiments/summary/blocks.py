"""Generated blocks inside hand-written pages: the text between two marker lines is replaced in place and the rest
of the file is kept byte for byte (``<!-- NAME:begin -->`` … ``<!-- NAME:end -->`` for doc pages,
``<!-- verdicts:start -->`` … ``<!-- verdicts:end -->`` for the README's block)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path

from p3o.errors import ConfigError

START, END = "<!-- verdicts:start -->", "<!-- verdicts:end -->"
#: Width of generated Markdown lines (the project's line length is 120).
WIDTH = 118


def links_from(page: Path) -> Callable[[Path], str]:
    """How `page` links to a path: relative to the page's folder (``docs/results/README.md`` -> ``../x.md``)."""
    return lambda path: os.path.relpath(path, page.parent)


def wrap(text: str, width: int = WIDTH, indent: str = "  ") -> list[str]:
    """`text` as lines of at most `width` characters (words never split), continuation lines indented."""
    lines = textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return lines or [""]


def write_block(path: str | Path, block: str, body: str) -> None:
    """Replace the text between ``<!-- {block}:begin -->`` and ``<!-- {block}:end -->`` lines of ``path`` with
    ``body`` (the markers are appended first when missing; the rest of the file is kept byte for byte)."""
    p = Path(path)
    begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
    text = p.read_text() if p.is_file() else ""
    if begin not in text or end not in text:
        text += f"\n{begin}\n{end}\n"
    pre, rest = text.split(begin, 1)
    p.write_text(f"{pre}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}")


def update_readme(readme: Path, block: str) -> None:
    """Replace the text between the markers in `readme` (ConfigError naming the file when they are absent)."""
    text = readme.read_text()
    if START not in text or END not in text:
        raise ConfigError(f"{readme}: no '{START}' … '{END}' block to update")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    readme.write_text(head + block + tail)

"""Text for the drawings: measured with the font matplotlib draws with, cut or wrapped to fit, numbers shortened.

Widths come from the glyphs themselves (``TextToPath``), so a cell, a title or a legend label is
cut with an ellipsis where it would reach its neighbour, never drawn over it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextToPath

DPI = 100
PT = DPI / 72  # pixels per point
_PATHS = TextToPath()


@lru_cache(maxsize=100_000)
def width(text: str, size: float, bold: bool = False) -> float:
    """Pixels ``text`` takes at ``size`` points (5 % added for the renderer's hinting)."""
    prop = FontProperties(size=size, weight="bold" if bold else "normal")
    w, _, _ = _PATHS.get_text_width_height_descent(text.replace("$", "S"), prop, ismath=False)
    return w * PT * 1.05


def fit(text: str, room: float, size: float, bold: bool = False) -> str:
    """``text`` on one line, cut with an ellipsis to ``room`` pixels."""
    if width(text, size, bold) <= room:
        return text
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if width(text[:mid].rstrip() + "…", size, bold) <= room:
            low = mid
        else:
            high = mid - 1
    return text[:low].rstrip() + "…" if low else ""


def wrap(text: str, room: float, size: float, lines: int, bold: bool = False) -> list[str]:
    """``text`` wrapped at spaces to ``room`` pixels, at most ``lines`` lines (the last cut with an ellipsis)."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        current = ""
        for word in paragraph.split(" "):
            candidate = f"{current} {word}" if current else word
            if current and width(candidate, size, bold) > room:
                out.append(current)
                current = word
            else:
                current = candidate
        out.append(current)
    if len(out) > lines:
        out = out[:lines]
        out[-1] = fit(out[-1] + " …", room, size, bold) if width(out[-1] + " …", size, bold) > room else out[-1] + " …"
    return [fit(line, room, size, bold) for line in out]


def plain(markdown: str) -> list[tuple[str, bool]]:
    """Markdown as plain text lines, each flagged when it is a heading."""
    out = []
    for line in markdown.splitlines():
        heading = line.startswith("#")
        line = re.sub(r"^#+\s*", "", line)
        line = re.sub(r"^\s*[-*]\s+", "• ", line)
        line = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line)
        line = line.replace("**", "").replace("`", "")
        out.append((line, heading))
    return out


def number(value: float) -> str:
    """A value as a dashboard shows it: three significant digits, k/M/G from a thousand up."""
    size = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= limit:
            return f"{value / limit:.3g}{suffix}"
    if size and size < 0.01:
        return f"{value:.1e}"
    return f"{value:.3g}"

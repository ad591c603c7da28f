"""Types of the C scanner (exporter/sources/_scan.c); see exporter/sources/promtext.py for how it is used."""

from collections.abc import Callable

# blocks: raw label block -> canonical key, or None for a series to skip
def scan(
    text: str, start: int, end: int, prefix: str, blocks: dict[str, str | None], /
) -> tuple[dict[str, float], list[str], int] | None: ...
def names(text: str, /) -> set[str] | None: ...

# strings: the parser's table of label names and values (one string per distinct text); None: not the plain layout.
# The bool: the block is spelt as its LabelSet key (exporter/series), which the parser then takes as is.
def labels(block: str, strings: dict[str, str], /) -> tuple[tuple[tuple[str, str], ...], bool] | None: ...

# a body of ``size`` bytes read through ``readinto``: a str when it came whole and ASCII, else the bytes read
def read_ascii(readinto: Callable[[memoryview], int | None], size: int, /) -> str | bytes: ...

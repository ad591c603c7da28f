"""Reading argparse's --help as data: what each option's help says (tests of the command-line rules)."""

from __future__ import annotations

import re


def entries(text: str) -> dict[str, str]:
    """Option or argument -> its help text, from argparse's sections (``options:``, ``positional arguments:``)."""
    out: dict[str, str] = {}
    current = None
    in_section = False
    for line in text.splitlines():
        if line and not line[0].isspace():
            in_section = line.endswith(":") and not line.startswith("usage:")
            current = None
            continue
        if not in_section or not line.strip():
            current = None
            continue
        if re.match(r"^  \S", line):
            invocation, _, rest = line.strip().partition("  ")
            current = invocation
            out[current] = rest.strip()
        elif current is not None:
            out[current] = f"{out[current]} {line.strip()}".strip()
    return out

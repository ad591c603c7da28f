"""``python -m render`` writes the artifacts; ``python -m render cost`` prices a deployment."""

from __future__ import annotations

import sys

from . import cost
from . import main as render


def main(argv: list[str]) -> int:
    return cost.main(argv[1:]) if argv[:1] == ["cost"] else render(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

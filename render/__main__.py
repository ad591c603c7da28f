"""``python -m render`` writes the artifacts; ``python -m render cost`` prices a deployment."""

from __future__ import annotations

import sys

from telemetry import logs

from . import cost
from . import main as render


def main(argv: list[str]) -> int:
    logs.catch_unexpected("render")  # no raw traceback on stderr, whatever fails (docs/reliability.md)
    return cost.main(argv[1:]) if argv[:1] == ["cost"] else render(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m render`` writes the artifacts; ``python -m render cost`` prices a deployment."""

from __future__ import annotations

import os
import sys

from telemetry import logs

from . import cost
from . import main as render

PROG = "python -m render"
# python -m render COMMAND: listed in --help, dispatched here before the render's own parser runs
COMMANDS = {"cost": "custom metrics, alarms and the monthly list price a deployment creates"}


def main(argv: list[str]) -> int:
    logs.catch_unexpected("render")  # no raw traceback on stderr, whatever fails (docs/reliability.md)
    if argv[:1] == ["cost"]:
        return cost.main(argv[1:], prog=f"{PROG} cost")
    return render(argv, PROG, commands=COMMANDS)


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`cost | head`): normal use. Silence the interpreter's own flush-at-exit complaint.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)

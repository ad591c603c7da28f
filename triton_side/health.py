"""The Triton container's health check: ``python3 /opt/triton-health/health.py [--deadline 4 ...]``.

The probe's code is ``probe.py`` and the modules it imports from this folder.
This file stays a few lines because Python compiles the script it is started
with on every run but loads an imported module from its cached bytecode
(``__pycache__``), and ECS starts this every 30 s in every task: compiling the
probe's code on every run would take longer than the rest of a probe run (the
"no bytecode cache" row of bench/bench_health.py). See docs/health.md.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # type checkers take it as True: they see the package import

if TYPE_CHECKING or __package__:
    from .probe import main
else:  # a script: Python 3.11+ with -I leaves the script's folder out of sys.path
    _HERE = os.path.dirname(os.path.abspath(__file__))
    if sys.path[:1] != [_HERE]:
        sys.path.insert(0, _HERE)
    from probe import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())

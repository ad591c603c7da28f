"""The catalog settings every command shares: ``--catalog``, ``--metrics``, ``--llm-metrics``.

``python -m exporter`` reads them through its Settings; ``catalog``,
``cost`` and ``render`` take the same flags and variables here, so what a
selection emits, costs and draws is one command away.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from . import BUILTIN_PACKS, Catalog, CatalogError, build

VARIABLES = {"catalog": "EXPORTER_CATALOG", "metrics": "EXPORTER_METRICS", "llm_metrics": "EXPORTER_LLM_METRICS"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--catalog",
        action="append",
        default=None,
        metavar="PATH",
        help=f"a user catalog file (repeatable) [env: EXPORTER_CATALOG, paths separated by {os.pathsep!r}]",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        metavar="PATTERNS",
        help="selection: comma-separated globs over EMF names, '-' excludes [env: EXPORTER_METRICS]",
    )
    parser.add_argument(
        "--llm-metrics",
        choices=("on", "off"),
        default=None,
        help="the built-in LLM pack (default: on) [env: EXPORTER_LLM_METRICS]",
    )


def attach_selection(argv: Sequence[str]) -> list[str]:
    """``--metrics -A*,-B*`` as ``--metrics=-A*,-B*``: argparse takes a value starting with ``-`` for an option.

    A selection that only excludes is the common one, so the separated
    spelling must work too.
    """
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        if items[i] == "--metrics" and i + 1 < len(items) and items[i + 1].startswith("-"):
            out.append(f"--metrics={items[i + 1]}")
            i += 2
            continue
        out.append(items[i])
        i += 1
    return out


def packs(llm: str) -> tuple[str, ...]:
    return BUILTIN_PACKS if llm == "on" else tuple(p for p in BUILTIN_PACKS if p != "llm")


def from_arguments(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Catalog:
    """The catalog the flags (else the variables) describe; raises CatalogError."""
    env = os.environ if environ is None else environ
    files = args.catalog if args.catalog else [p for p in env.get(VARIABLES["catalog"], "").split(os.pathsep) if p]
    selection = args.metrics if args.metrics is not None else env.get(VARIABLES["metrics"], "")
    llm = args.llm_metrics or env.get(VARIABLES["llm_metrics"], "on").strip().lower()
    if llm not in ("on", "off"):  # as the daemon refuses it: a value read as "off" would drop the pack silently
        raise CatalogError(f"{VARIABLES['llm_metrics']}={llm!r}: must be on or off")
    return build(files, selection, packs(llm))

"""The deploy artifacts' generator: dashboards, alarms, scaling, their Terraform and docs from the catalog.

    python -m render [...]        write them (``python -m exporter render`` is an alias)
    python -m render cost [...]   what they and the sidecar cost (``python -m exporter cost`` is an alias)

It reads the catalog and the output layer only, never the sidecar.

The output is committed; tests/unit/render/test_render.py renders again with the
defaults and fails when the committed files differ, so a catalog change
that breaks a widget or an alarm shows up in review, not in production.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from catalog import CatalogError, cli
from telemetry.settings import (
    ArgumentParser,
    ConfigError,
    Option,
    add_commands,
    add_options,
    command_first,
    fail,
    integer,
    number,
    parse,
)

from . import alarms, dashboard, docsgen, template, terraform
from .base.options import Options

GENERATED_DIRS = ("dashboards", "alarms")


def render(opts: Options) -> dict[str, str]:
    """Relative path -> file text, for everything the command writes."""
    files: dict[str, str] = {
        "dashboards/triton.json": json.dumps(dashboard.build(opts), indent=2) + "\n",
        "alarms/triton-alarms.template.json": json.dumps(template.build(opts), indent=2) + "\n",
        "docs/metrics.md": docsgen.metrics_markdown(opts.catalog, opts.namespace),
        docsgen.MODELSYNC_DOC: docsgen.modelsync_markdown(opts.modelsync),
    }
    for rel, text in alarms.cli_files(opts).items():
        files[f"alarms/cli/{rel}"] = text
    files |= terraform.files(opts)  # deploy/terraform/alarms.tf.json and the dashboard's templatefile()
    return files


def stale_files(root: Path, files: dict[str, str]) -> list[Path]:
    """Files under the generated directories that this render would not write (left from older options)."""
    out = []
    for d in GENERATED_DIRS:
        base = root / d
        if base.is_dir():
            out += [p for p in sorted(base.rglob("*")) if p.is_file() and p.relative_to(root).as_posix() not in files]
    return out


_CONVERTERS: dict[type, Callable[[str], Any]] = {str: str, float: number, int: integer}


def options_table() -> tuple[Option, ...]:
    """One option per Options field that has a help text (the table is options.py), and the catalog's."""
    out = []
    for f in fields(Options):
        if "help" not in f.metadata:
            continue
        repeatable = isinstance(f.default, tuple)
        shown = f.metadata["shown"]
        out.append(
            Option(
                f.name,
                f.metadata["flag"] or "--" + f.name.replace("_", "-"),
                convert=str if repeatable else _CONVERTERS[type(f.default)],
                help=f.metadata["help"],
                repeatable=repeatable,
                metavar=f.metadata["metavar"],
                shown=shown
                if shown is not None
                else f"{f.default:g}"
                if isinstance(f.default, float)
                else str(f.default),
            )
        )
    return (*out, *cli.OPTIONS)


def _parser(
    table: Sequence[Option], prog: str = "python -m render", commands: Mapping[str, str] | None = None
) -> ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        description="Write dashboards/, alarms/, deploy/terraform/alarms.tf.json and "
        "docs/metrics.md from the metric catalog (with --catalog files and the --metrics "
        "selection: only emitted metrics are used).",
    )
    add_commands(p, commands or {})
    p.add_argument("--out", default=".", metavar="DIR", help="directory to write into (default: current directory)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ from a render")
    add_options(p, table)  # each option's default is in its ``shown`` (options_table)
    return p


def options_from(values: Mapping[str, Any]) -> Options:
    """Options from the settings' values, with the catalog they describe (raises CatalogError, ValueError)."""
    catalog = cli.from_values(values)
    given = {k: v for k, v in values.items() if k not in cli.FIELDS}
    if "models" in given:
        given["models"] = tuple(dict.fromkeys(given["models"]))
    opts = Options(catalog=catalog, **given)
    if not 1 <= opts.gpu_scale_in <= 100:
        raise ValueError("need 1 <= --gpu-scale-in <= 100")
    scaling = {
        "--pending-scale-out": opts.pending_scale_out,
        "--queue-time-scale-out-ms": opts.queue_time_scale_out_us,  # the parameter is in microseconds: >= 1
        "--requests-waiting-scale-out": opts.requests_waiting_scale_out,
    }
    for flag, value in scaling.items():
        if value < 1:
            raise ValueError(f"need {flag} >= 1" + (" us (0.001 ms)" if "queue" in flag else ""))
    if not 0 <= opts.task_start_seconds <= 3600 or not 60 <= opts.scale_in_cooldown <= 86400:
        raise ValueError("need 0 <= --task-start-seconds <= 3600 and 60 <= --scale-in-cooldown <= 86400")
    if opts.min_capacity < 1:
        # With no task nothing emits the signals, missing data is not breaching: the service would never scale out.
        raise ValueError("need --min-capacity >= 1: with no task no signal is emitted and scaling never adds one")
    if opts.min_capacity > opts.max_capacity:
        raise ValueError("need --min-capacity <= --max-capacity")
    if not 1 <= opts.version_skew_periods <= 288:  # CloudWatch: at most a day of 5-minute periods
        raise ValueError("need 1 <= --version-skew-periods <= 288")
    return opts


def main(argv: Sequence[str], prog: str = "python -m render", commands: Mapping[str, str] | None = None) -> int:
    """``commands``: the subcommands the entry point dispatches, for --help (python -m render's cost)."""
    table = options_table()
    try:
        parser = _parser(table, prog, commands)
        args, values = parse(parser, table, argv, os.environ)
        command_first(parser, args)
        opts = options_from(values)
        files = render(opts)
    except ConfigError as exc:
        return fail(prog, f"invalid setting: {exc}")
    except CatalogError as exc:
        return fail(prog, f"invalid catalog: {exc}")
    except (ValueError, KeyError) as exc:  # CatalogError is a ValueError
        return fail(prog, str(exc))
    root = Path(args.out)
    if root.exists() and not root.is_dir():
        return fail(prog, f"--out {root}: not a folder")
    try:
        return _write(root, files, args.check)
    except (OSError, UnicodeDecodeError) as exc:  # a folder we cannot read or write: say where, no traceback
        where = getattr(exc, "filename", None) or root
        return fail(prog, f"--out {root}: cannot write {where}: {getattr(exc, 'strerror', None) or exc}")


def _write(root: Path, files: dict[str, str], check: bool) -> int:
    differ = [
        rel
        for rel, text in files.items()
        if not (root / rel).is_file() or (root / rel).read_text(encoding="utf-8") != text
    ]
    stale = stale_files(root, files)
    if check:
        for rel in differ:
            sys.stdout.write(f"differs: {rel}\n")
        for p in stale:
            sys.stdout.write(f"stale: {p.relative_to(root)}\n")
        return 1 if differ or stale else 0
    for rel in differ:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel], encoding="utf-8")
        if rel.endswith(".sh"):
            path.chmod(0o755)
    for p in stale:
        p.unlink()
    sys.stdout.write(f"{len(files)} files, {len(differ)} written, {len(stale)} stale removed under {root}/\n")
    return 0

"""What one probe run found, and how it is printed: the ECS health-check output.

Docker keeps the last lines a health check prints and ``docker inspect`` shows
them, so the output is the probe's interface: one ``FAIL`` line per failing
check, then one ``OK``/``UNHEALTHY`` summary line (or, with ``--json``, one
document with every check). :class:`Check` and :class:`Report` hold the results
the checks (``probe.py``) record; :func:`render_text` and :func:`render_json`
write them; :func:`first_line` keeps one readable line of Triton's reasons.
See docs/health.md ("Output"). Standard library only, Python 3.8+.
"""

from __future__ import annotations

REASON_MAX = 240  # characters of Triton's reason (or of any detail) kept on a line
NAME_MAX = 120  # characters of a model name kept on a line (Triton's own names are directory names)
LIST_MAX = 8  # model versions named on the OK line before "+N more"
FAIL_LINES_MAX = 20  # FAIL lines printed before "+N more" (Docker keeps only the last 4 KiB of a check's output)


class Check:
    """One check's outcome; ``status`` is ok, fail or skip."""

    FIELDS = ("check", "status", "duration_s", "detail", "model", "version", "state", "reason")  # --json's keys
    __slots__ = FIELDS

    def __init__(
        self,
        check: str,
        status: str,
        duration_s: float = 0.0,
        detail: str = "",
        model: str | None = None,
        version: str | None = None,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.check = check
        self.status = status
        self.duration_s = duration_s
        self.detail = detail
        self.model = model
        self.version = version
        self.state = state
        self.reason = reason

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.FIELDS}

    @property
    def label(self) -> str:
        name = first_line(self.model, NAME_MAX)
        return f"{name}/{first_line(self.version, NAME_MAX)}" if self.version else name


class Report:
    """Every check of one probe run, in order, and the versions it required."""

    def __init__(self, url: str, deadline_s: float) -> None:
        self.url = url
        self.deadline_s = deadline_s
        self.checks: list[Check] = []
        self.duration_s = 0.0
        self.required: list[str] = []

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and not any(c.status == "fail" for c in self.checks)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check


def first_line(text: object, limit: int = REASON_MAX) -> str:
    """First non-empty line of Triton's reason, control characters removed, capped."""
    s = str(text or "")
    line = next((ln.strip() for ln in s.splitlines() if ln.strip()), "")
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _describe(c: Check) -> str:
    detail = first_line(c.detail)
    if c.model is None:
        return f"FAIL {c.check}: {detail}"
    who = f"model {first_line(repr(c.model), NAME_MAX)}"
    if c.version:
        who += f" version {first_line(c.version, 20)}"
    if c.check == "state":
        tail = f": {first_line(c.reason)}" if c.reason and c.reason not in c.detail else ""
        return f"FAIL {who} is {first_line(c.state, 40)}: {detail}{tail}"
    return f"FAIL {who} ({first_line(c.state, 40) or 'state unknown'}) {c.check} check: {detail}"


def _names(labels: list[str]) -> str:
    shown = ", ".join(labels[:LIST_MAX])
    return shown + (f", +{len(labels) - LIST_MAX} more" if len(labels) > LIST_MAX else "")


def render_text(report: Report) -> str:
    """Lines for a human: one per failing check, then one summary line."""
    fails = [c for c in report.checks if c.status == "fail"]
    ready_ok = [c.label for c in report.checks if c.check == "ready" and c.status != "fail"]
    smoke = [c for c in report.checks if c.check == "smoke"]
    smoke_ok = sum(c.status == "ok" for c in smoke)
    skipped = [c for c in smoke if c.status == "skip"]
    took = f"{report.duration_s:.2f} s"
    if not fails:
        parts = [
            f"OK triton {report.url}: live",
            f"{len(ready_ok)} model version(s) ready ({_names(ready_ok)})",
        ]
        if smoke:
            parts.append(f"smoke inference ok for {smoke_ok}")
        if skipped:
            parts.append(
                "skipped "
                + "; ".join(f"{c.label}: {first_line(c.detail)}" for c in skipped[:3])
                + (f"; +{len(skipped) - 3} more" if len(skipped) > 3 else "")
            )
        return ", ".join(parts) + f"; {took}"
    lines = [_describe(c) for c in fails[:FAIL_LINES_MAX]]
    if len(fails) > FAIL_LINES_MAX:
        lines.append(f"FAIL +{len(fails) - FAIL_LINES_MAX} more failed check(s) (--json lists every check)")
    what = _names([c.label if c.model else c.check for c in fails])
    if any(c.check == "live" for c in fails):
        summary = f"UNHEALTHY triton {report.url}: server not answering; {took}"
    else:
        summary = (
            f"UNHEALTHY triton {report.url}: {len(fails)} failed check(s) ({what}); "
            f"{len(ready_ok)} of {len(report.required)} required model version(s) ready; {took}"
        )
    return "\n".join([*lines, summary])


def render_json(report: Report) -> str:
    import json  # only --json needs it: ~5 ms (re, enum) the default run does not pay

    doc = {
        "healthy": report.healthy,
        "url": report.url,
        "deadline_s": report.deadline_s,
        "duration_s": round(report.duration_s, 4),
        "required": report.required,
        "failed": sum(c.status == "fail" for c in report.checks),
        "checks": [dict(c.as_dict(), duration_s=round(c.duration_s, 4)) for c in report.checks],
        "summary": render_text(report).splitlines()[-1],
    }
    return json.dumps(doc, ensure_ascii=False)

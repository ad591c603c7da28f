"""Classic Fluent Bit config reader, checker and routing simulator for the tests.

No Fluent Bit binary is installable here, so the tests interpret the real
``fluentbit/*.conf`` files with this module: a change to the config is what the
tests test. It models the parts of Fluent Bit 1.9.10 / 4.1 that the Triton
pipeline uses, following their C sources: the classic file format and
``${ENV}`` substitution, Onigmo regexes (Ruby syntax, emulated on the ``regex``
package, refusing constructs the two engines read differently), the record
accessor templates, and the filters ``multiline`` (regex rules and
``partial_message``), ``rewrite_tag``, ``modify``, ``parser`` and the
``cloudwatch_logs`` output's group and stream naming. Where 1.9.10 and 4.1
read an option differently (``/regex/imx`` options, ``Preserve_Key`` without
``Reserve_Data``, a ``$`` ``Key_Name``), or an option is not modelled, the
configuration is refused (:class:`ConfigError`), never read one way. What it
cannot show (option values the C plugins reject, memory limits, timing) is why
docs/logs.md asks for ``fluent-bit --dry-run`` in the real image.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import regex

# ---------------------------------------------------------------------------------------------
# Classic config format
# ---------------------------------------------------------------------------------------------

SECTION_NAMES = {"SERVICE", "INPUT", "FILTER", "OUTPUT", "PARSER", "MULTILINE_PARSER"}


class ConfigError(ValueError):
    """The file would not load (or would misbehave) in Fluent Bit."""


@dataclass
class Section:
    kind: str
    entries: list[tuple[str, str]]
    line: int
    path: Path

    def get(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.entries:
            if k.lower() == key.lower():
                return v
        return default

    def all(self, key: str) -> list[str]:
        return [v for k, v in self.entries if k.lower() == key.lower()]

    @property
    def name(self) -> str:
        return (self.get("Name") or "").lower()

    def where(self) -> str:
        return f"{self.path.name}:{self.line} [{self.kind}] {self.get('Name')}"


def parse_classic(path: Path) -> list[Section]:
    """Read one classic-mode file: ``[SECTION]`` headers then indented ``Key Value`` lines."""
    sections: list[Section] = []
    current: Section | None = None
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("@"):
            raise ConfigError(f"{path.name}:{no}: directive {stripped.split()[0]} not supported in this include")
        m = re.fullmatch(r"\[([A-Z_]+)\]", stripped)
        if m:
            if m.group(1) not in SECTION_NAMES:
                raise ConfigError(f"{path.name}:{no}: unknown section [{m.group(1)}]")
            current = Section(m.group(1), [], no, path)
            sections.append(current)
            continue
        if current is None:
            raise ConfigError(f"{path.name}:{no}: entry outside a section: {stripped!r}")
        if line[0] not in " \t":
            raise ConfigError(f"{path.name}:{no}: entries must be indented: {stripped!r}")
        parts = stripped.split(None, 1)
        if len(parts) != 2:
            raise ConfigError(f"{path.name}:{no}: key without value: {stripped!r}")
        current.entries.append((parts[0], parts[1].strip()))
    return sections


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# Variables Docker sets in every container, whatever the image or task definition says.
CONTAINER_ENV = {"HOSTNAME": "ip-10-0-1-23.ec2.internal"}


def substitute_env(value: str, env: dict[str, str]) -> str:
    """``${VAR}`` substitution as the config loader does it; an unset variable is an error here."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in env and name not in CONTAINER_ENV:
            raise ConfigError(f"environment variable {name} is not set")
        return env.get(name, CONTAINER_ENV.get(name, ""))

    return _ENV.sub(repl, value)


# ---------------------------------------------------------------------------------------------
# Onigmo (Ruby syntax) on the `regex` package
# ---------------------------------------------------------------------------------------------

# Escapes that mean the same in Onigmo/Ruby and in `regex` with the ASCII flag.
_SAME_ESCAPES = set("dDsSwWbBAtnrfv") | set("\\.[](){}*+?|^$/-\"':,#@!=<>&%;_ ")
_GROUP_OPENERS = ("(?:", "(?=", "(?!", "(?<=", "(?<!", "(?>")


class OnigmoError(ConfigError):
    """A regex uses a construct Onigmo lacks, or one the two engines read differently."""


def onigmo_to_python(pattern: str) -> str:
    """Translate an Onigmo pattern to the `regex` package, keeping Ruby semantics.

    Ruby's ``^``/``$`` are always line anchors (compiled with MULTILINE), ``.``
    never matches a newline (no DOTALL), ``\\d\\w\\s`` are ASCII (ASCII flag),
    ``\\z`` is the end of the string and ``\\Z`` the end before a final newline.
    Anything outside this known-common subset is refused rather than guessed.
    """
    out: list[str] = []
    i = 0
    n = len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise OnigmoError(f"trailing backslash in {pattern!r}")
            e = pattern[i + 1]
            if e == "z" and not in_class:
                out.append(r"\Z")
            elif e == "Z" and not in_class:
                out.append(r"(?=\n?\Z)")
            elif e == "x":
                hexd = pattern[i + 2 : i + 4]
                if not re.fullmatch(r"[0-9A-Fa-f]{2}", hexd):
                    raise OnigmoError(f"bad \\x escape in {pattern!r}")
                out.append("\\x" + hexd)
                i += 4
                continue
            elif e in _SAME_ESCAPES or (e.isdigit() and e != "0"):
                out.append("\\" + e)
            else:
                raise OnigmoError(f"escape \\{e} differs or is missing between Onigmo and Python: {pattern!r}")
            i += 2
            continue
        if in_class:
            if c == "[":
                if pattern.startswith("[:", i):
                    raise OnigmoError(f"POSIX bracket in {pattern!r}")
                raise OnigmoError(f"nested character class (Onigmo set operation) in {pattern!r}")
            if c == "&" and pattern.startswith("&&", i):
                raise OnigmoError(f"class intersection && in {pattern!r}")
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append(r"\]")
                i += 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            m = re.match(r"\(\?<([A-Za-z_][A-Za-z0-9_]*)>", pattern[i:])
            if m:
                out.append(m.group(0))
                i += len(m.group(0))
                continue
            for opener in _GROUP_OPENERS:
                if pattern.startswith(opener, i):
                    out.append(opener)
                    i += len(opener)
                    break
            else:
                raise OnigmoError(f"group syntax {pattern[i : i + 4]!r} not in the common subset: {pattern!r}")
            continue
        if c in "*+?" and out and out[-1] in ("*", "+", "?", "}") and c == "+":
            raise OnigmoError(f"possessive quantifier in {pattern!r}")
        out.append(c)
        i += 1
    if in_class:
        raise OnigmoError(f"unterminated character class in {pattern!r}")
    return "".join(out)


def compile_onigmo(pattern: str) -> regex.Pattern[str]:
    """Compile a Fluent Bit regex value. flb_regex.c str_to_regex strips the slashes of ``/.../`` on both
    versions; ``/.../imx`` options exist on 4.1 only (check_option), 1.9.10 reads them as literal text,
    so a pattern with options is refused."""
    flags = regex.MULTILINE | regex.ASCII
    options = re.fullmatch(r"/(.*)/([mixo]+)", pattern, flags=re.S)
    if options and set(options.group(2)) & set("mix"):
        raise OnigmoError(f"{pattern!r}: /.../{options.group(2)} options exist on Fluent Bit 4.1, not on 1.9.10")
    if len(pattern) >= 2 and pattern.startswith("/") and pattern.endswith("/"):
        pattern = pattern[1:-1]
    try:
        return regex.compile(onigmo_to_python(pattern), flags)
    except regex.error as exc:
        raise OnigmoError(f"{pattern!r}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Record accessor templates
# ---------------------------------------------------------------------------------------------

_TEMPLATE_VAR = re.compile(r"\$(TAG\[\d+\]|TAG|\d|[A-Za-z_][^.\s,\"]*)")


def check_template(template: str) -> None:
    """Every variable must be followed by ``.``, ``,`` or the end (flb_record_accessor parsing)."""
    for m in _TEMPLATE_VAR.finditer(template):
        rest = template[m.end() :]
        if rest and rest[0] not in ".,":
            raise ConfigError(f"template {template!r}: ${m.group(1)} is followed by {rest[0]!r}")
        if (
            not m.group(1).startswith("TAG")
            and not m.group(1).isdigit()
            and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1))
        ):
            raise ConfigError(f"template {template!r}: key ${m.group(1)} would include stray characters")


def _tag_part(tag: str, index: int) -> str:
    parts = tag.split(".")
    return parts[index] if index < len(parts) else ""


class TemplateMissing(LookupError):
    """A record key used by a template is absent (Fluent Bit falls back)."""


def translate(template: str, tag: str, record: dict | None = None, groups: tuple[str, ...] = ()) -> str:
    """Render a record accessor template (``$TAG``, ``$TAG[n]``, ``$0``-``$9``, ``$key``)."""
    check_template(template)

    def repl(m: re.Match[str]) -> str:
        var = m.group(1)
        if var == "TAG":
            return tag
        if var.startswith("TAG["):
            return _tag_part(tag, int(var[4:-1]))
        if var.isdigit():
            idx = int(var)
            return groups[idx] if idx < len(groups) and groups[idx] is not None else ""
        if record is None or var not in record:
            raise TemplateMissing(var)
        return str(record[var])

    return _TEMPLATE_VAR.sub(repl, template)


# ---------------------------------------------------------------------------------------------
# Plugins and checks
# ---------------------------------------------------------------------------------------------

COMMON_KEYS = {"name", "match", "match_regex", "alias", "log_level"}
# Options used here that exist under these names on both Fluent Bit 1.9.10 and 4.1.
PLUGIN_KEYS: dict[tuple[str, str], set[str]] = {
    ("INPUT", "tcp"): {
        "tag",
        "listen",
        "port",
        "format",
        "separator",
        "chunk_size",
        "buffer_size",
        "mem_buf_limit",
        "storage.type",
    },
    ("FILTER", "multiline"): {
        "multiline.key_content",
        "multiline.parser",
        "mode",
        "buffer",
        "flush_ms",
        "emitter_name",
        "emitter_storage.type",
        "emitter_mem_buf_limit",
    },
    ("FILTER", "rewrite_tag"): {"rule", "emitter_name", "emitter_storage.type", "emitter_mem_buf_limit"},
    ("FILTER", "modify"): {
        "condition",
        "set",
        "add",
        "remove",
        "rename",
        "hard_rename",
        "copy",
        "hard_copy",
        "remove_wildcard",
        "remove_regex",
    },
    ("FILTER", "parser"): {"key_name", "parser", "reserve_data", "preserve_key", "unescape_key"},
    ("OUTPUT", "cloudwatch_logs"): {
        "region",
        "log_group_name",
        "log_group_template",
        "log_stream_name",
        "log_stream_prefix",
        "log_stream_template",
        "log_key",
        "log_format",
        "auto_create_group",
        "log_retention_days",
        "role_arn",
        "endpoint",
        "sts_endpoint",
        "workers",
        "retry_limit",
        "auto_retry_requests",
    },
}
REQUIRED_KEYS: dict[tuple[str, str], set[str]] = {
    ("INPUT", "tcp"): {"tag", "port"},
    ("FILTER", "multiline"): {"multiline.key_content"},
    ("FILTER", "rewrite_tag"): {"rule"},
    ("FILTER", "parser"): {"key_name", "parser"},
    ("OUTPUT", "cloudwatch_logs"): {"region", "log_group_name"},
}
PARSER_KEYS = {
    "name",
    "format",
    "regex",
    "time_key",
    "time_format",
    "time_keep",
    "time_offset",
    "decode_field",
    "decode_field_as",
    "types",
    "skip_empty_values",
}
MULTILINE_KEYS = {"name", "type", "flush_timeout", "rule", "key_content", "parser", "match_string", "negate"}
LOG_GROUP_RE = re.compile(r"[\.\-_/#A-Za-z0-9]{1,512}")
RETENTION_DAYS = {
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
}


@dataclass
class Parser:
    name: str
    regex: regex.Pattern[str]
    time_key: str | None
    time_format: str | None
    time_keep: bool
    decoders: list[tuple[str, str]]  # (kind, field)
    skip_empty: bool = True


@dataclass
class MLRule:
    from_state: str
    regex: regex.Pattern[str]
    to_state: str


@dataclass
class MLParser:
    name: str
    rules: list[MLRule]
    flush_timeout_ms: int


def _bool(value: str | None, default: bool = False) -> bool:
    if value is None:
        return default
    return value.strip().lower() in ("on", "true", "yes", "1")


def load_parsers(path: Path) -> tuple[dict[str, Parser], dict[str, MLParser]]:
    parsers: dict[str, Parser] = {}
    mls: dict[str, MLParser] = {}
    for s in parse_classic(path):
        keys = {k.lower() for k, _ in s.entries}
        if s.kind == "PARSER":
            if unknown := keys - PARSER_KEYS:
                raise ConfigError(f"{s.where()}: unknown keys {sorted(unknown)}")
            if (s.get("Format") or "").lower() != "regex" or not s.get("Regex"):
                raise ConfigError(f"{s.where()}: only Format regex with a Regex is used here")
            if unmodelled := keys & {"decode_field", "types", "time_offset"}:
                raise ConfigError(f"{s.where()}: {sorted(unmodelled)} not modelled by this simulator")
            decoders = []
            for d in s.all("Decode_Field_As"):
                kind, _, fld = d.partition(" ")
                if kind in ("escaped_utf8", "json"):
                    # escaped_utf8 decodes short \u sequences and surrogates differently on 1.9.10 and 4.1
                    raise ConfigError(f"{s.where()}: decoder {kind} not modelled by this simulator")
                if kind != "escaped":
                    raise ConfigError(f"{s.where()}: unknown decoder {kind}")
                decoders.append((kind, fld.strip()))
            name = s.get("Name") or ""
            if name in parsers:
                raise ConfigError(f"{s.where()}: duplicate parser {name}")
            parsers[name] = Parser(
                name,
                compile_onigmo(s.get("Regex") or ""),
                s.get("Time_Key") or ("time" if s.get("Time_Format") else None),  # flb_parser_regex.c cb_results
                s.get("Time_Format"),
                _bool(s.get("Time_Keep")),
                decoders,
                _bool(s.get("Skip_Empty_Values"), default=True),  # flb_parser.c: skip_empty = FLB_TRUE
            )
            if s.get("Time_Key") and s.get("Time_Key") not in parsers[name].regex.groupindex:
                raise ConfigError(f"{s.where()}: Time_Key {s.get('Time_Key')} is not a capture")
        elif s.kind == "MULTILINE_PARSER":
            if unknown := keys - MULTILINE_KEYS:
                raise ConfigError(f"{s.where()}: unknown keys {sorted(unknown)}")
            if (s.get("Type") or "").lower() != "regex":
                raise ConfigError(f"{s.where()}: only Type regex is modelled")
            rules = []
            for r in s.all("Rule"):
                parts = re.findall(r'"((?:[^"\\]|\\.)*)"', r)
                if len(parts) != 3 or re.sub(r'"((?:[^"\\]|\\.)*)"', "", r).strip():
                    raise ConfigError(f"{s.where()}: a Rule is three double-quoted fields: {r}")
                rules.append(MLRule(parts[0], compile_onigmo(parts[1]), parts[2]))
            states = {r.from_state for r in rules}
            if "start_state" not in states:
                raise ConfigError(f"{s.where()}: no start_state rule")
            for r in rules:
                if r.to_state not in states:
                    raise ConfigError(f"{s.where()}: state {r.to_state} has no rules")
            mls[s.get("Name") or ""] = MLParser(s.get("Name") or "", rules, int(s.get("Flush_Timeout") or 4000))
        else:
            raise ConfigError(f"{s.where()}: section not allowed in a parsers file")
    return parsers, mls


# ---------------------------------------------------------------------------------------------
# Pipeline
# ---------------------------------------------------------------------------------------------


@dataclass
class Record:
    tag: str
    time: float
    body: dict
    origin: int | None = None  # index of the filter whose emitter produced it
    hops: int = 0


@dataclass
class Event:
    """One CloudWatch Logs event as cloudwatch_logs would send it."""

    group: str
    stream: str
    message: str
    time: float
    record: dict
    tag: str


def wildcard_matches(pattern: str, tag: str) -> bool:
    """flb_router.c router_match: ``*`` is the only wildcard (any run of characters, dots included);
    every other character, ``?`` and ``[`` too, stands for itself; case-sensitive; the whole tag."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), tag, re.S) is not None


def tag_matches(section: Section, tag: str) -> bool:
    """flb_router.c router_match: Match_Regex is tried with onig_match at the start of the tag (anchored
    there, not searched) and counts only when it matches at least one character; when it does not, Match
    (if also given) is tried as a wildcard."""
    if section.get("Match_Regex"):
        m = compile_onigmo(section.get("Match_Regex") or "").match(tag)
        if m is not None and m.end() > 0:
            return True
    match = section.get("Match")
    return match is not None and wildcard_matches(match, tag)


def unescape(text: str) -> str:
    """flb_unescape.c flb_unescape_string (Decode_Field_As escaped), the same on 1.9.10 and 4.1: \\n \\a
    \\b \\t \\v \\f \\r \\\\ are decoded; before any other character the backslash is dropped and the
    character kept (\\" is ", \\u00e9 is u00e9). A final lone backslash makes it read past the value."""
    simple = {"n": "\n", "a": "\a", "b": "\b", "t": "\t", "v": "\v", "f": "\f", "r": "\r", "\\": "\\"}
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text):
                raise ConfigError(f"escaped decoder: {text!r} ends with a lone backslash (undefined in Fluent Bit)")
            out.append(simple.get(text[i + 1], text[i + 1]))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_time(value: str, fmt: str, now: datetime) -> float | None:
    """Fluent Bit time parsing; formats without a year get the current one; UTC unless the format has %z.
    None when the value does not fit the format (flb_parser_time_lookup fails)."""
    py = fmt.replace("%L", "%f")
    text = value
    if "%Y" not in fmt and "%y" not in fmt:
        py, text = "%Y " + py, f"{now.year} {value}"
    try:
        dt = datetime.strptime(text, py)
    except ValueError:
        return None
    dt = dt.astimezone(UTC) if dt.tzinfo else dt.replace(tzinfo=UTC)
    return calendar.timegm(dt.timetuple()) + dt.microsecond / 1e6


class Pipeline:
    """The include file plus the parsers file it names, ready to run records through."""

    def __init__(
        self, conf: Path, env: dict[str, str], image_paths: dict[str, Path] | None = None, now: datetime | None = None
    ) -> None:
        self.conf = conf
        self.env = env
        self.now = now or datetime.now(UTC)
        self.sections = parse_classic(conf)
        for s in self.sections:
            s.entries = [(k, substitute_env(v, env)) for k, v in s.entries]
        self.parsers: dict[str, Parser] = {}
        self.ml_parsers: dict[str, MLParser] = {}
        for s in self.sections:
            if s.kind == "SERVICE":
                for pf in s.all("Parsers_File"):
                    local = (image_paths or {}).get(pf, conf.parent / Path(pf).name)
                    if not local.exists():
                        raise ConfigError(f"Parsers_File {pf} does not exist (looked at {local})")
                    p, m = load_parsers(local)
                    self.parsers.update(p)
                    self.ml_parsers.update(m)
            elif s.kind in ("PARSER", "MULTILINE_PARSER"):
                raise ConfigError(f"{s.where()}: keep parsers in the Parsers_File")
        self.inputs = [s for s in self.sections if s.kind == "INPUT"]
        self.filters = [s for s in self.sections if s.kind == "FILTER"]
        self.outputs = [s for s in self.sections if s.kind == "OUTPUT"]
        self._validate()
        self._ml_state: dict[tuple[int, str], dict] = {}
        self._partial: dict[tuple[int, str, str], list[Record]] = {}

    # --- static checks ------------------------------------------------------------------

    def _validate(self) -> None:
        for s in self.inputs + self.filters + self.outputs:
            plugin = (s.kind, s.name)
            if s.kind == "INPUT" and s.name == "forward":
                raise ConfigError(f"{s.where()}: FireLens already declares the forward input")
            if plugin not in PLUGIN_KEYS:
                raise ConfigError(f"{s.where()}: plugin not modelled")
            keys = {k.lower() for k, _ in s.entries}
            if unknown := keys - PLUGIN_KEYS[plugin] - COMMON_KEYS:
                raise ConfigError(f"{s.where()}: unknown keys {sorted(unknown)}")
            if missing := REQUIRED_KEYS.get(plugin, set()) - keys:
                raise ConfigError(f"{s.where()}: missing {sorted(missing)}")
            if s.kind != "INPUT" and not (s.get("Match") or s.get("Match_Regex")):
                raise ConfigError(f"{s.where()}: no Match")
            if s.name == "parser":
                for p in s.all("Parser"):
                    if p not in self.parsers:
                        raise ConfigError(f"{s.where()}: parser {p} is not defined")
                if _bool(s.get("Preserve_Key")) and not _bool(s.get("Reserve_Data")):
                    # filter_parser.c: 1.9.10 drops Key_Name anyway without Reserve_Data, 4.1 keeps it.
                    raise ConfigError(f"{s.where()}: Preserve_Key without Reserve_Data differs on 1.9.10 and 4.1")
                if (s.get("Key_Name") or "").startswith("$"):
                    raise ConfigError(f"{s.where()}: a $record_accessor Key_Name is 4.1 only (1.9.10: a literal key)")
                if _bool(s.get("Unescape_Key")):
                    raise ConfigError(f"{s.where()}: Unescape_Key not modelled by this simulator")
            if s.name == "modify":
                for k, v in s.entries:
                    if k.lower() in ("hard_rename", "copy", "hard_copy", "remove_wildcard", "remove_regex"):
                        raise ConfigError(f"{s.where()}: {k} not modelled by this simulator")
                    if k.lower() == "condition" and v.split()[0].lower() not in (
                        "key_value_equals",
                        "key_exists",
                        "key_does_not_exist",
                    ):
                        raise ConfigError(f"{s.where()}: condition {v.split()[0]} not modelled by this simulator")
            if s.name == "multiline":
                mode = (s.get("mode") or "parser").lower()
                if mode == "partial_message" and s.get("multiline.parser"):
                    raise ConfigError(f"{s.where()}: partial_message mode excludes multiline.parser")
                if s.get("buffer") is not None and not _bool(s.get("buffer")):
                    raise ConfigError(f"{s.where()}: buffer off (no emitter) not modelled by this simulator")
                names = [n.strip() for n in (s.get("multiline.parser") or "").split(",") if n.strip()]
                if mode != "partial_message" and len(names) != 1:
                    # ml.c: none is an error; several are tried in turn, which is not modelled here
                    raise ConfigError(f"{s.where()}: needs exactly one multiline.parser here, got {names}")
                for p in (s.get("multiline.parser") or "").split(","):
                    if p.strip() and p.strip() not in self.ml_parsers:
                        raise ConfigError(f"{s.where()}: multiline parser {p.strip()} is not defined")
            if s.name == "rewrite_tag":
                for rule in s.all("Rule"):
                    self._rule(rule)
            if s.name == "cloudwatch_logs":
                for key in ("log_group_template", "log_stream_template"):
                    if s.get(key):
                        check_template(s.get(key) or "")
                days = s.get("log_retention_days")
                if days is not None and int(days) not in RETENTION_DAYS | {0}:
                    raise ConfigError(f"{s.where()}: log_retention_days {days} is not a CloudWatch value")
                if not LOG_GROUP_RE.fullmatch(s.get("log_group_name") or ""):
                    raise ConfigError(f"{s.where()}: log_group_name {s.get('log_group_name')!r} is invalid")
                # cloudwatch_logs.c cb_cloudwatch_init, both versions: exactly one of the two, even when a
                # log_stream_template names every stream (the name or prefix is its fallback).
                if (s.get("log_stream_name") is None) == (s.get("log_stream_prefix") is None):
                    raise ConfigError(f"{s.where()}: Either 'log_stream_name' or 'log_stream_prefix' is required")
        multiline_matches = [s for s in self.filters if s.name == "multiline"]
        if multiline_matches and self.filters[0] is not multiline_matches[0]:
            raise ConfigError("the first multiline filter must be the first filter (it re-emits to the head)")

    def _rule(self, rule: str) -> tuple[str, regex.Pattern[str], str, bool]:
        parts = rule.split(None, 3)
        if len(parts) != 4:
            raise ConfigError(f"rewrite_tag Rule needs 4 fields: {rule}")
        key, rx, new_tag, keep = parts
        if not re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"rewrite_tag key {key} is not a plain $key")
        if keep.lower() not in ("true", "false"):
            raise ConfigError(f"rewrite_tag keep flag {keep}")
        check_template(new_tag)
        return key[1:], compile_onigmo(rx), new_tag, keep.lower() == "true"

    # --- running -----------------------------------------------------------------------

    def run(self, records: Iterable[Record], max_hops: int = 12) -> list[Event]:
        """Run records through filters (with re-emission to the head) and outputs."""
        queue: deque[Record] = deque(records)
        events: list[Event] = []
        while True:
            while queue:
                rec = queue.popleft()
                if rec.hops > max_hops:
                    raise ConfigError(f"record re-emitted {rec.hops} times: pipeline cycle at tag {rec.tag}")
                out = self._filters(rec, queue)
                if out is not None:
                    events.extend(self._deliver(out))
            flushed = self._flush_all()
            if not flushed:
                return events
            queue.extend(flushed)

    def _filters(self, rec: Record, queue: deque[Record]) -> Record | None:
        for idx, f in enumerate(self.filters):
            if not tag_matches(f, rec.tag):
                continue
            if f.name == "multiline":
                if rec.origin == idx:
                    continue  # a multiline filter ignores its own emitter's records
                emitted = self._multiline(idx, f, rec)
                for e in emitted:
                    queue.append(Record(e.tag, e.time, e.body, origin=idx, hops=rec.hops + 1))
                return None
            if f.name == "rewrite_tag":
                for rule in f.all("Rule"):
                    key, rx, new_tag, keep = self._rule(rule)
                    value = rec.body.get(key)
                    if not isinstance(value, str):
                        continue
                    m = rx.search(value)
                    if m is None:
                        continue
                    groups = (m.group(0), *m.groups())
                    tag = translate(new_tag, rec.tag, rec.body, groups)
                    queue.append(Record(tag, rec.time, dict(rec.body), origin=idx, hops=rec.hops + 1))
                    if not keep:
                        return None
                    break
                continue
            if f.name == "modify":
                self._modify(f, rec)
            elif f.name == "parser":
                self._parser(f, rec)
        return rec

    def _modify(self, f: Section, rec: Record) -> None:
        for cond in f.all("Condition"):
            kind, *args = cond.split()
            kind = kind.lower()
            if kind == "key_value_equals" and rec.body.get(args[0]) != args[1]:
                return
            if kind == "key_exists" and args[0] not in rec.body:
                return
            if kind == "key_does_not_exist" and args[0] in rec.body:
                return
            if kind not in ("key_value_equals", "key_exists", "key_does_not_exist"):
                raise ConfigError(f"{f.where()}: condition {kind} not modelled")
        for k, v in f.entries:
            op = k.lower()
            args = v.split(None, 1)
            if op == "rename" and args[0] in rec.body and args[1] not in rec.body:
                rec.body = {(args[1] if key == args[0] else key): val for key, val in rec.body.items()}
            elif op == "set" or (op == "add" and args[0] not in rec.body):
                rec.body[args[0]] = args[1]
            elif op == "remove":
                rec.body.pop(args[0], None)

    def _parser(self, f: Section, rec: Record) -> None:
        key = f.get("Key_Name") or ""
        value = rec.body.get(key)
        if not isinstance(value, str):
            return
        for pname in f.all("Parser"):
            p = self.parsers[pname]
            m = p.regex.search(value)
            if m is None:
                continue
            # flb_parser_regex.c cb_results, per named group in order: an empty (or unset) capture is skipped
            # unless Skip_Empty_Values is off; with a Time_Format, the time key sets the record's time and
            # leaves unless Time_Keep, and a value that does not fit the format is dropped, time unchanged.
            parsed: dict = {}
            for k, v in m.groupdict().items():
                v = v or ""
                if not v and p.skip_empty:
                    continue
                if p.time_format and k == p.time_key:
                    t = parse_time(v, p.time_format, self.now)
                    if t is None:
                        continue
                    rec.time = t
                    if not p.time_keep:
                        continue
                parsed[k] = v
            for _kind, fld in p.decoders:
                if fld in parsed:
                    parsed[fld] = unescape(parsed[fld])
            # filter_parser.c: the parsed keys, then (Reserve_Data) the record's others, Key_Name among them
            # only with Preserve_Key (flb_msgpack_expand_map). A key in both would be written twice.
            kept = {k: v for k, v in rec.body.items() if k != key or _bool(f.get("Preserve_Key"))}
            if _bool(f.get("Reserve_Data")):
                if clash := sorted(set(parsed) & set(kept)):
                    raise ConfigError(f"{f.where()}: parsed {clash} also in the record: Fluent Bit writes both")
                parsed.update(kept)
            rec.body = parsed
            return

    def _multiline(self, idx: int, f: Section, rec: Record) -> list[Record]:
        key = f.get("multiline.key_content") or "log"
        if (f.get("mode") or "parser").lower() == "partial_message":
            if rec.body.get("partial_message") != "true":
                return [rec]
            pid = str(rec.body.get("partial_id"))
            buf = self._partial.setdefault((idx, rec.tag, pid), [])
            buf.append(rec)
            if rec.body.get("partial_last") != "true":
                return []
            del self._partial[(idx, rec.tag, pid)]
            parts = sorted(buf, key=lambda r: int(r.body.get("partial_ordinal", 0)))
            body = {k: v for k, v in parts[0].body.items() if not k.startswith("partial_")}
            body[key] = "".join(str(p.body.get(key, "")) for p in parts)
            return [Record(rec.tag, parts[0].time, body)]
        ml = self.ml_parsers[(f.get("multiline.parser") or "").split(",")[0].strip()]
        state = self._ml_state.setdefault((idx, rec.tag), {"rule": None, "buf": None, "first": None})
        content = rec.body.get(key)
        if not isinstance(content, str):
            return [*self._ml_flush(state), rec]
        emitted: list[Record] = []
        matched = False
        if state["rule"] is not None:
            for r in ml.rules:
                if r.from_state == state["rule"].to_state and r.from_state != "start_state" and r.regex.search(content):
                    if state["buf"] and not state["buf"].endswith("\n"):
                        state["buf"] += "\n"
                    state["buf"] += content if content else "\n"
                    state["rule"] = r
                    matched = True
                    break
        if not matched:
            for r in ml.rules:
                if r.from_state == "start_state" and r.regex.search(content):
                    emitted += self._ml_flush(state)
                    state.update(rule=r, buf=content, first=rec)
                    matched = True
                    break
        if not matched:
            emitted += self._ml_flush(state)
            emitted.append(rec)
        return emitted

    def _ml_flush(self, state: dict) -> list[Record]:
        if state["buf"] is None:
            state["rule"] = None
            return []
        first: Record = state["first"]
        body = dict(first.body)
        body["log"] = state["buf"]
        state.update(rule=None, buf=None, first=None)
        return [Record(first.tag, first.time, body)]

    def _flush_all(self) -> list[Record]:
        """What the Flush_Timeout / flush_ms timers emit once input goes quiet."""
        out: list[Record] = []
        for (idx, _tag), state in self._ml_state.items():
            for r in self._ml_flush(state):
                out.append(Record(r.tag, r.time, r.body, origin=idx, hops=1))
        for (idx, _tag, _pid), parts in list(self._partial.items()):
            # an unterminated partial series is flushed as it is, never dropped
            for p in parts:
                out.append(Record(p.tag, p.time, p.body, origin=idx, hops=1))
        self._partial.clear()
        return out

    def _deliver(self, rec: Record) -> list[Event]:
        events = []
        for o in self.outputs:
            if not tag_matches(o, rec.tag):
                continue
            group = o.get("log_group_name") or ""
            if o.get("log_group_template"):
                with contextlib.suppress(TemplateMissing):
                    group = translate(o.get("log_group_template") or "", rec.tag, rec.body)
            # cloudwatch_api.c get_log_stream: a template first; else (or when it fails) log_stream_name, else
            # log_stream_prefix + tag.
            stream = o.get("log_stream_name") or (o.get("log_stream_prefix") or "") + rec.tag
            if o.get("log_stream_template"):
                with contextlib.suppress(TemplateMissing):
                    stream = translate(o.get("log_stream_template") or "", rec.tag, rec.body)
            if o.get("log_key"):
                if o.get("log_key") not in rec.body:
                    continue  # cloudwatch_logs skips records without the key
                message = str(rec.body[o.get("log_key") or ""])
            else:
                message = json.dumps(rec.body, ensure_ascii=False)
            events.append(Event(group, stream, message, rec.time, rec.body, rec.tag))
        return events

    # --- reachability and cycles -------------------------------------------------------

    def reachable_tags(self, firelens_containers: Iterable[str], task_id: str = "0123456789abcdef") -> set[str]:
        """Every tag a record can carry, found by running sample records of every shape."""
        tags: set[str] = set()
        for s in self.inputs:
            tags.add(s.get("Tag") or "")
        for c in firelens_containers:
            tags.add(f"{c}-firelens-{task_id}")
        changed = True
        while changed:
            changed = False
            for tag in list(tags):
                for f in self.filters:
                    if f.name != "rewrite_tag" or not tag_matches(f, tag):
                        continue
                    for rule in f.all("Rule"):
                        _, _, new_tag, _ = self._rule(rule)
                        for sample in (
                            ("x",),
                            ("a", "b"),
                            ("a", "b", "c"),
                            ("a", "b", "c", "d"),
                            ("a", "b", "c", "d", "e"),
                        ):
                            t = translate(new_tag, tag, {}, ("whole", *sample))
                            if t not in tags and t.count(".") < 12:
                                tags.add(t)
                                changed = True
        return tags

    def check_reachability(self, firelens_containers: Iterable[str]) -> None:
        tags = self.reachable_tags(firelens_containers)
        for s in self.filters + self.outputs:
            if not any(tag_matches(s, t) for t in tags):
                raise ConfigError(f"{s.where()}: Match {s.get('Match') or s.get('Match_Regex')} is never reached")

    def check_no_rewrite_cycle(self, firelens_containers: Iterable[str]) -> None:
        for tag in self.reachable_tags(firelens_containers):
            for f in self.filters:
                if f.name != "rewrite_tag" or not tag_matches(f, tag):
                    continue
                for rule in f.all("Rule"):
                    _, _, new_tag, _ = self._rule(rule)
                    for sample in (("x",), ("a", "b", "c", "d")):
                        t = translate(new_tag, tag, {}, ("whole", *sample))
                        if tag_matches(f, t):
                            raise ConfigError(f"{f.where()}: new tag {t} is caught by its own Match")


@dataclass
class FireLensTask:
    """Make records the way FireLens delivers a container's lines (fluentd log driver)."""

    container: str
    task_id: str = "4f1b2c3d4e5f60718293a4b5c6d7e8f9"
    cluster: str = "demo"
    partial_limit: int = 16 * 1024
    _partial_seq: int = field(default=0, repr=False)

    @property
    def tag(self) -> str:
        return f"{self.container}-firelens-{self.task_id}"

    def records(self, lines: Iterable[str], stream: str = "stderr", t0: float = 1.7e9) -> list[Record]:
        out: list[Record] = []
        for i, line in enumerate(lines):
            base = {
                "source": stream,
                "container_id": "c0ffee" * 10 + "abcd",
                "container_name": f"/ecs-triton-1-{self.container}-0000",
                "ecs_cluster": self.cluster,
                "ecs_task_arn": f"arn:aws:ecs:us-east-1:123456789012:task/{self.cluster}/{self.task_id}",
                "ecs_task_definition": "triton:1",
            }
            data = line.encode()
            if len(data) <= self.partial_limit:
                out.append(Record(self.tag, t0 + i * 1e-3, {"log": line, **base}))
                continue
            self._partial_seq += 1
            chunks = [data[k : k + self.partial_limit] for k in range(0, len(data), self.partial_limit)]
            for n, chunk in enumerate(chunks, 1):
                out.append(
                    Record(
                        self.tag,
                        t0 + i * 1e-3,
                        {
                            "log": chunk.decode(errors="surrogateescape"),
                            **base,
                            "partial_message": "true",
                            "partial_id": f"p{self._partial_seq}",
                            "partial_ordinal": str(n),
                            "partial_last": "true" if n == len(chunks) else "false",
                        },
                    )
                )
        return out


def dockerfile_env(dockerfile: Path) -> dict[str, str]:
    """The ``ENV`` defaults the router image bakes in."""
    text = dockerfile.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().upper().startswith("ENV "):
            for m in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", line):
                env[m.group(1)] = m.group(2)
    return env


def dockerfile_copies(dockerfile: Path) -> dict[str, Path]:
    """Map each image path the Dockerfile COPYs to the file in the build context."""
    out: dict[str, Path] = {}
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].upper() == "COPY":
            out[parts[2]] = dockerfile.parent / parts[1]
    return out

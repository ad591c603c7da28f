"""A Prometheus text-format reader that only reads what the catalog needs.

Why not prometheus_client's ``text_string_to_metric_families``: it turns
every line of the body into objects, and Triton's body is mostly series we
do not need (four of its five summaries, HELP text). bench/bench_pipeline.py
prints the ratio. prometheus_client stays the reference:
tests/unit/exporter/test_promtext_diff.py proves both agree on every kept sample.

How:
- The exposition format keeps each family's lines together after its
  ``# TYPE`` line, so only the blocks of wanted families are scanned. A
  wanted name with no ``# TYPE`` line (absent, the common case for optional
  families, or untyped) is looked for in one pass over the whole body.
- Two ways to read a block: the C scanner (``exporter/sources/_scan.c``, which the
  image always builds) for the plain layout, and the full grammar as one
  regex per name, in pure Python, for everything else (timestamps, odd value
  spellings, malformed lines) and where no compiler built the scanner.
  bench/bench_pipeline.py prints both: at 1000 models the C scanner parses in
  ~6-7 ms, the regex path in ~35 ms. (A third, regex "fast lane" between the
  two saved 16 % of the pure-Python path and was dropped.)
- Label blocks repeat across families (``model="m",version="1"`` is on ~20
  lines per model), so each distinct block is parsed once and cached as an
  interned :class:`LabelSet`.
- A line that starts with a wanted name but breaks the grammar is skipped
  and counted (``malformed``), never guessed at.
- ``selects`` (from ``Catalog.sample_selects``) names samples of which only
  some values of one label are read (three of a summary's five quantiles):
  their other series are skipped as the scanner meets them, and their label
  blocks never interned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from ..series import EMPTY, Exposition, LabelSet

# Numbers as Go's ParseFloat reads them (Prometheus' reference parser); Triton really prints
# "Nan" for an empty summary quantile, so NaN and Inf are case-insensitive.
_VALUE = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[Ii][Nn][Ff](?:[Ii][Nn][Ii][Tt][Yy])?|[Nn][Aa][Nn])"
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|$)')
_PLAIN_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\\n]*)"')
_PLAIN_ONE = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
_PLAIN_BLOCK = re.compile(rf"(?:{_PLAIN_ONE},)*(?:{_PLAIN_ONE},?)?")
_ESCAPES = re.compile(r"\\(.)")
_UNESCAPE = {"n": "\n", "\\": "\\", '"': '"'}
_SUFFIXES = ("_count", "_sum", "_bucket")

try:  # the C scanner (setup.py builds it when a compiler is there); same results, ~5x faster than the regex
    from . import _scan

    HAVE_SCANNER = True
except ImportError:  # pragma: no cover - depends on the build
    HAVE_SCANNER = False  # _scan stays unbound: only used when Parser.native is true

MAX_ERROR_EXAMPLES = 5
"""How many malformed lines one parse keeps (truncated to 200 chars) for the log."""


_ENTITY_LABELS = {"model": ("model", "version"), "gpu": ("gpu_uuid",), "task": ()}


class LabelError(ValueError):
    """A label block that does not follow the exposition grammar."""


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    # Unknown escapes keep their backslash, as prometheus_client does.
    return _ESCAPES.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(0)), value)


def parse_labels(block: str, strings: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """Parse the text between ``{`` and ``}`` into sorted (name, value) pairs.

    ``strings`` interns names and values: ``model="m"`` is on every block of that model, and one string
    per distinct text instead of one per block is most of the label cache's memory at 1000 models.
    """
    if _PLAIN_BLOCK.fullmatch(block):
        # The layout Triton writes (no blanks, no escapes): the whole block checked by one regex, its pairs
        # read by another. A repeated name falls through to the loop below, which names it.
        found = _PLAIN_PAIR.findall(block)
        if strings is None:
            pairs = dict(found)
        else:
            intern = strings.setdefault
            pairs = {intern(k, k): intern(v, v) for k, v in found}
        if len(pairs) == len(found):
            return tuple(sorted(pairs.items()))
    pairs = {}
    pos, end = 0, len(block)
    while pos < end:
        m = _LABEL.match(block, pos)
        if m is None:
            if block[pos:].strip() == "":
                break
            raise LabelError(f"bad label syntax at {pos}: {block[pos : pos + 40]!r}")
        name = m.group(1)
        if name in pairs:
            raise LabelError(f"duplicate label {name!r}")
        value = _unescape(m.group(2))
        if strings is not None:
            name, value = strings.setdefault(name, name), strings.setdefault(value, value)
        pairs[name] = value
        pos = m.end()
        if m.group(3) == "" and pos < end:
            raise LabelError(f"missing comma at {pos}")
    return tuple(sorted(pairs.items()))


class Parser:
    """Reads only the given sample names (``x_count``/``x_sum``/``x_bucket`` are names too).

    One instance is reused across scrapes so its label cache pays off. The
    cache is cleared when it holds more than twice the blocks the last body
    needed (at least ``min_cache``, at most ``max_cache``), so under model
    churn it tracks the live set; a clear costs one re-parse per block, and
    equal label sets stay equal across it (keys are content-derived).
    """

    def __init__(
        self,
        names: Iterable[str],
        max_cache: int = 100_000,
        min_cache: int = 1_000,
        native: bool = True,
        selects: Mapping[str, tuple[str, frozenset[str]]] | None = None,
    ) -> None:
        self.names = frozenset(names)
        self.selects = dict(selects or {})  # sample -> (label, the values kept)
        self._cache: dict[str, str] = {"": EMPTY.key}  # raw label block -> canonical key
        # Per selected sample: raw label block -> canonical key, or None for a series it skips
        self._select_caches: dict[str, dict[str, str | None]] = {}
        self.native = native and HAVE_SCANNER
        self._interned: dict[str, LabelSet] = {EMPTY.key: EMPTY}
        self._strings: dict[str, str] = {}  # label names and values, one string per distinct text
        self._models: set[str] = set()  # entity keys of the model versions interned
        self._patterns: dict[str, re.Pattern[str]] = {}
        self._untyped_patterns: dict[frozenset[str], re.Pattern[str]] = {}
        self.max_cache = max_cache
        self.min_cache = min_cache
        self._bound = max_cache  # shrinks to a few times the live set after the first parse

    def _pattern(self, name: str) -> re.Pattern[str]:
        pat = self._patterns.get(name)
        if pat is None:
            alt = re.escape(name)
            # Group 1 name, 2 label block, 3 value: a well-formed sample (timestamp ignored).
            # Group 4: any other line that starts with a wanted name then '{', blank or end.
            pat = re.compile(
                rf"^({alt})(?:(?:\{{([^\n]*)\}})?[ \t]+({_VALUE})(?:[ \t]+-?\d+)?[ \t]*\r?$|([{{ \t][^\n]*|\r?)$)",
                re.MULTILINE,
            )
            self._patterns[name] = pat
        return pat

    def _blocks(self, text: str) -> dict[tuple[int, int], set[str]]:
        """Map each text region to scan to the wanted names expected in it."""
        families = self._typed_families(text)
        blocks: dict[tuple[int, int], set[str]] = {}
        n = len(text)
        untyped: list[str] = []
        for name in self.names:
            found = families.get(name)
            span = found[:2] if found else None
            if span is None:
                for suffix in _SUFFIXES:
                    # x_count/x_sum/x_bucket belong to family x only if x is a summary or histogram.
                    parent = families.get(name[: -len(suffix)]) if name.endswith(suffix) else None
                    if parent and parent[2] in ("summary", "histogram"):
                        span = parent[:2]
                        break
            if span is None:
                untyped.append(name)
            else:
                blocks.setdefault(span, set()).add(name)
        if untyped:
            # Absent (the common case for optional families, the LLM ones) or untyped: one pass over the
            # body tells which start a line; those are read from the whole body.
            present = self._line_starts(text, untyped)
            for name in untyped:
                if name in present:
                    blocks.setdefault((0, n), set()).add(name)
        return blocks

    def _line_starts(self, text: str, names: list[str]) -> set[str]:
        """Which of ``names`` start a line of ``text`` (followed by ``{``, a blank or the line's end)."""
        if self.native:
            found = _scan.names(text)
            if found is not None:
                return found
        key = frozenset(names)
        pat = self._untyped_patterns.get(key)
        if pat is None:
            if len(self._untyped_patterns) > 16:
                self._untyped_patterns.clear()
            alt = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
            # A leading literal \n lets the regex engine skip to newlines (an \A alternative makes it try
            # every position: ~15x slower); the first line is checked apart.
            pat = self._untyped_patterns[key] = re.compile(rf"\n({alt})(?=[{{ \t\r\n]|\Z)")
        found = set(pat.findall(text))
        ends = ("", "{", " ", "\t", "\r", "\n")
        found.update(n for n in names if text.startswith(n) and text[len(n) : len(n) + 1] in ends)
        return found

    @staticmethod
    def _typed_families(text: str) -> dict[str, tuple[int, int, str]]:
        """One pass over the TYPE lines: family -> (first sample line, end of block, type).

        The format keeps a family's samples together after its TYPE line, so
        a block ends at the next TYPE line of another family. HELP lines do
        not end a block: a garbled HELP line must not hide a family's samples.
        Only the canonical "# TYPE " spelling is looked for (a fast, long
        needle); a family typed with other spacing is searched as untyped,
        which finds the same lines.
        """
        spans: dict[str, tuple[int, int, str]] = {}
        current, start, kind = None, 0, ""
        at_start = text.startswith("# TYPE ")
        pos = 0 if at_start else text.find("\n# TYPE ")
        while pos >= 0:
            head = 0 if (pos == 0 and at_start) else pos + 1
            line_end = text.find("\n", head)
            if line_end < 0:
                line_end = len(text)
            words = text[head + 7 : line_end].split(None, 2)
            if words:
                if current is not None and words[0] != current:
                    spans.setdefault(current, (start, head, kind))
                current, start = words[0], min(line_end + 1, len(text))
                kind = words[1] if len(words) > 1 else "untyped"
            pos = text.find("\n# TYPE ", line_end)
        if current is not None:
            spans.setdefault(current, (start, len(text), kind))
        return spans

    def parse(self, text: str) -> Exposition:
        out = Exposition()
        if len(self._cache) > self._bound or any(len(c) > self._bound for c in self._select_caches.values()):
            # Blocks of vanished series (model churn) would otherwise stay until max_cache.
            self._cache = {"": EMPTY.key}
            self._interned = {EMPTY.key: EMPTY}
            self._strings = {}
            self._models = set()
            self._select_caches = {}
        for (start, end), names in self._blocks(text).items():
            for name in names:
                if self.native and self._native(out, text, name, start, end):
                    continue
                blocks, values = self._strict(out, text, name, start, end)
                cache = self._heads(name)
                for block in set(blocks).difference(cache):
                    if not self._resolve(name, block):
                        blocks, values = self._drop_bad_labels(out, name, blocks, values, block)
                kept = [(k, v) for k, v in zip(map(cache.__getitem__, blocks), values) if k is not None]
                series = out.samples.setdefault(name, {})
                before = len(series)
                series.update(kept)
                out.duplicates += before + len(kept) - len(series)
        # A name with no sample (only a longer name shares its prefix, or an empty family) has no entry,
        # whichever path read it.
        out.samples = {name: series for name, series in out.samples.items() if series}
        out.labels = self._interned
        out.models = self._models  # shared, not copied: read only
        self._bound = min(self.max_cache, max(self.min_cache, 2 * out.count()))
        return out

    def _native(self, out: Exposition, text: str, name: str, start: int, end: int) -> bool:
        """The plain layout through the C scanner (exporter/sources/_scan.c): False means "use the Python paths".

        Label blocks the scanner has not seen are checked here with the full
        grammar before they are trusted; a bad one sends the whole block to the
        strict path, which counts it.
        """
        heads = self._heads(name)
        for _ in range(2):
            found = _scan.scan(text, start, end, name + "{", heads)
            if found is None:
                return False
            series, unknown, duplicates = found
            if not unknown:
                break
            for block in unknown:
                if not self._resolve(name, block):
                    return False
        else:
            return False
        target = out.samples.get(name)
        if target is None:
            out.samples[name] = series
        else:
            before = len(target) + len(series)
            target.update(series)
            duplicates += before - len(target)
        out.duplicates += duplicates
        return True

    def _strict(
        self, out: Exposition, text: str, name: str, start: int, end: int
    ) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """The full grammar, line by line in the regex: slower, counts malformed lines."""
        blocks, values = [], []
        for _, block, value, bad in self._pattern(name).findall(text, start, end):
            if value:
                blocks.append(block)
                values.append(float(value))
            elif bad.strip() or not bad:
                self._malformed(out, name + bad)
        return tuple(blocks), tuple(values)

    def _drop_bad_labels(
        self, out: Exposition, name: str, blocks: Sequence[str], values: Sequence[float], block: str
    ) -> tuple[tuple[str, ...], tuple[float, ...]]:
        keep = [(b, v) for b, v in zip(blocks, values, strict=True) if b != block]
        for _ in range(len(blocks) - len(keep)):
            self._malformed(out, f"{name}{{{block}}}")
        return tuple(b for b, _ in keep), tuple(v for _, v in keep)

    def _heads(self, name: str) -> dict[str, str | None]:
        """The label-block cache that reads ``name``: the shared one, or the sample's own when it is selected."""
        if name not in self.selects:
            return cast("dict[str, str | None]", self._cache)  # never given None: str values only
        return self._select_caches.setdefault(name, {})

    def _resolve(self, name: str, block: str) -> bool:
        """Put ``block`` into ``name``'s cache; False for a block that breaks the grammar."""
        if name not in self.selects:
            return self._labels(block) is not None
        label, values = self.selects[name]
        key = self._cache.get(block)
        if key is None:
            try:
                pairs, spelt = self._pairs(block)
            except LabelError:
                return False
            if dict(pairs).get(label) not in values:  # skipped, and its labels never interned
                self._select_caches[name][block] = None
                return True
            key = self._intern(block, pairs, spelt).key
        elif self._interned[key].labels.get(label) not in values:
            self._select_caches[name][block] = None
            return True
        self._select_caches[name][block] = key
        return True

    def _labels(self, block: str) -> LabelSet | None:
        try:
            pairs, spelt = self._pairs(block)
        except LabelError:
            return None
        return self._intern(block, pairs, spelt)

    def _pairs(self, block: str) -> tuple[tuple[tuple[str, str], ...], bool]:
        """``parse_labels`` of ``block``, Triton's plain layout read by the C scanner when there is one; and
        whether the block is spelt as its key (the scanner tells; the Python path leaves it to ``_intern``)."""
        if self.native:
            found = _scan.labels(block, self._strings)
            if found is not None:
                return found
        return parse_labels(block, self._strings), False

    def _intern(self, block: str, pairs: tuple[tuple[str, str], ...], spelt: bool) -> LabelSet:
        """The one LabelSet of ``pairs`` (read from ``block``), sharing its entity's tuple and key."""
        labels = LabelSet(pairs, block if spelt else None)
        if labels.key == block:
            labels.key = block  # Triton's blocks are spelt as keys are: one string for the cache and the set
        labels = self._interned.setdefault(labels.key, labels)
        entity = self._interned.get(labels.entity_key)
        if entity is None:
            # The transform names entities by entity_key; keep a LabelSet for it too.
            kind, *values = labels.entity
            entity = LabelSet(tuple(sorted(zip(_ENTITY_LABELS[kind], values, strict=True))))
            entity.share_entity(entity)
            entity = self._interned.setdefault(entity.key, entity)
        labels.share_entity(entity)
        if labels.entity[0] == "model":
            self._models.add(labels.entity_key)
        self._cache[block] = labels.key
        return labels

    @staticmethod
    def _malformed(out: Exposition, line: str) -> None:
        out.malformed += 1
        if len(out.examples) < MAX_ERROR_EXAMPLES:
            out.examples.append(line[:200])

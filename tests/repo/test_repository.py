"""Rules about the repository's own text: what a reader of a clone can follow."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO
TEXT = {".py", ".md", ".sh", ".c", ".toml", ".yaml", ".json", ".conf", ".txt", ".pbtxt", ".cfg", ".lua", ".tf", ""}
# A pointer to the team's private notes folder (outside the repository), relative or by an absolute path,
# which a clone elsewhere does not have either. The folder's name is spelt apart, so that this file, which
# the rule scans too, holds no pointer itself.
NOTES = "shar" + "ed"
PRIVATE_NOTES = re.compile(r"(?<![\w.])(?:\.\./|(?:/[\w.-]+)+/)?" + NOTES + r"/[A-Z][A-Z_]*\.md")


def test_no_code_or_doc_points_at_files_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    hits = []
    for rel in tracked.splitlines():
        path = ROOT / rel
        if path.suffix not in TEXT or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        hits += [f"{rel}: {m.group(0)}" for m in PRIVATE_NOTES.finditer(text)]
    assert hits == [], "say the fact (or cite the upstream source) instead of pointing at private notes"


def test_the_rule_catches_the_forms_it_is_for():
    for text in (
        f"see {NOTES}/TRITON_FACTS.md",
        f"(../{NOTES}/AWS_FACTS.md)",
        f"``{NOTES}/TRITON_FACTS.md``",
        f"(/work/{NOTES}/ECS_REHEARSAL_FACTS.md has",
        f"parallel GETs gain (/home/me/notes/{NOTES}/MODEL_SYNC_FACTS.md).",
    ):
        assert PRIVATE_NOTES.search(text), text
    assert not PRIVATE_NOTES.search(f"listener/app/{NOTES}/50dc6c495c0c9188/")


# --- links between the pages: every relative link and anchor of README.md and docs/*.md resolves ---------

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?\b(?:href|src)=\"([^\"]+)\"")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code blanked (a link in code is an example)."""
    out, fenced = [], None
    for line in text.splitlines():
        mark = FENCE.match(line.lstrip())
        if mark and (fenced is None or mark.group(1) == fenced):
            fenced = mark.group(1) if fenced is None else None
            out.append("")
            continue
        out.append("" if fenced else line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown page has: its headings' slugs (repeats numbered as GitHub does), HTML anchors."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        out.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(pages: list[Path], root: Path) -> list[str]:
    """'page:line: target (why)' for each relative link whose file or anchor does not exist."""
    found: list[str] = []
    cache: dict[Path, set[str]] = {}
    for page in pages:
        for number, line in enumerate(prose_lines(page.read_text(encoding="utf-8")), 1):
            prose = INLINE_CODE.sub("", line)
            for target in LINK.findall(prose) + HTML_LINK.findall(prose):
                if SCHEME.match(target):
                    continue  # a URL: not ours to resolve offline
                where, _, anchor = target.partition("#")
                dest = (page.parent / where).resolve() if where else page
                rel = f"{page.relative_to(root)}:{number}: {target}"
                if not dest.is_relative_to(root):
                    found.append(f"{rel} (outside the repository)")
                elif not dest.exists():
                    found.append(f"{rel} (no such file)")
                elif anchor and dest.suffix == ".md":
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        found.append(f"{rel} (no such heading in {dest.relative_to(root)})")
    return found


def markdown_pages() -> list[Path]:
    """README.md, docs/*.md and every other Markdown file of the checkout (committed or not, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    pages = {ROOT / p for p in listed if (ROOT / p).is_file()}
    return sorted(pages | {ROOT / "README.md", *(ROOT / "docs").glob("*.md")})


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    pages = markdown_pages()
    assert ROOT / "README.md" in pages and ROOT / "docs" / "deploy.md" in pages
    assert broken_links(pages, ROOT) == []


def test_the_link_check_catches_what_it_is_for(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        '# A page\n\n## `--nvml` / `EXPORTER_NVML`\n\n## Cost\n\n## Cost\n\n<a id="here"></a>\n'
        "```sh\n# not a heading: [no](missing.md)\n```\n"
    )
    (tmp_path / "img.png").write_bytes(b"")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#a-page) [ok](docs/a.md#--nvml--exporter_nvml) [ok](docs/a.md#cost-1)\n"
        "[ok](docs/a.md#here) ![ok](img.png) [ok](https://example.com/x.md#y) [ok](#title) `[code](gone.md)`\n"
        "# Title\n"
        "[bad](docs/b.md) [bad](docs/a.md#cost-2) [bad](#nowhere) [bad](docs/a.md#not-a-heading-no)\n"
        '[bad](../outside.md) <a href="img.png"><img src="docs/gone.png" width="9"></a>\n'
    )
    found = broken_links([tmp_path / "README.md", tmp_path / "docs" / "a.md"], tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "docs/b.md (no such file)",
        "docs/a.md#cost-2 (no such heading in docs/a.md)",
        "#nowhere (no such heading in README.md)",
        "docs/a.md#not-a-heading-no (no such heading in docs/a.md)",
        "../outside.md (outside the repository)",
        "docs/gone.png (no such file)",
    ]


def test_the_settings_doc_lists_every_exporter_setting_and_no_other():
    """docs/exporter.md's settings table: one row per option of exporter/config.py, with its variables."""
    from exporter.config import OPTIONS

    text = (ROOT / "docs" / "exporter.md").read_text()
    table = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        flags = re.findall(r"`(--[a-z-]+)`", cells[0]) if len(cells) >= 3 else []
        if flags:
            rows[flags[0]] = cells[1]
    assert set(rows) == {o.flag for o in OPTIONS}, "add (or remove) the setting's row in docs/exporter.md"
    for option in OPTIONS:
        for env in option.env:
            assert f"`{env}`" in rows[option.flag], (option.flag, env)

"""Rules about the repository's own text: what a reader of a clone can follow."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = {".py", ".md", ".sh", ".c", ".toml", ".yaml", ".json", ".conf", ".txt", ".pbtxt", ".cfg", ".lua", ".tf", ""}
# A pointer to the team's private notes folder (outside the repository): "../shared/X_FACTS.md", or by an
# absolute path ("/work/shared/X_FACTS.md"), which a clone elsewhere does not have either.
PRIVATE_NOTES = re.compile(r"(?<![\w.])(?:\.\./|(?:/[\w.-]+)+/)?" + "shared" + r"/[A-Z][A-Z_]*\.md")


def test_no_code_or_doc_points_at_files_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    hits = []
    for rel in tracked.splitlines():
        path = ROOT / rel
        if rel == "tests/test_repository.py" or path.suffix not in TEXT or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        hits += [f"{rel}: {m.group(0)}" for m in PRIVATE_NOTES.finditer(text)]
    assert hits == [], "say the fact (or cite the upstream source) instead of pointing at private notes"


def test_the_rule_catches_the_forms_it_is_for():
    for text in (
        "see shared/TRITON_FACTS.md",
        "(../shared/AWS_FACTS.md)",
        "``shared/TRITON_FACTS.md``",
        "(/work/" + "shared/ECS_REHEARSAL_FACTS.md has",
        "parallel GETs gain (/home/me/notes/" + "shared/MODEL_SYNC_FACTS.md).",
    ):
        assert PRIVATE_NOTES.search(text), text
    assert not PRIVATE_NOTES.search("listener/app/shared/50dc6c495c0c9188/")

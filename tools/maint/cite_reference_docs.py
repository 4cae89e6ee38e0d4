#!/usr/bin/env python3
"""Rewrites citations of the team's reference documents (SPEC.md, SERVING.md, PERFORMANCE.md,
ARCHITECTURE.md of ../shared) to the copies under docs/reference/, so every comment cites a file in
this repository (issue 13). Idempotent. Usage: tools/maint/cite_reference_docs.py [paths...]"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUFFIXES = {".cpp", ".h", ".cu", ".cuh", ".js", ".sh", ".py", ".md", ".txt", ".cmake"}
NAMES = "SPEC|SERVING|PERFORMANCE"
# "../shared/SPEC.md", "shared/SPEC.md" -> docs/reference/SPEC.md (ARCHITECTURE.md only in this form:
# the repo has its own docs/ARCHITECTURE.md).
SHARED = re.compile(r"(?:\.\./)?shared/(SPEC|SERVING|PERFORMANCE|ARCHITECTURE)\.md")
# "SPEC.md" (any use), then "SPEC 5.4" / "SERVING 4" (a section number without .md); never one
# already under docs/reference/.
WITH_MD = re.compile(r"(?<![/\w])(" + NAMES + r")\.md\b")
NUMBERED = re.compile(r"(?<![/\w])(" + NAMES + r")(?=( section)? ?[0-9])")


# This script and the lint that runs it name the bare forms on purpose.
SELF = {pathlib.Path(__file__).resolve(), ROOT / "scripts" / "lint.sh"}


def rewrite(text):
    text = SHARED.sub(lambda m: f"docs/reference/{m.group(1)}.md", text)
    text = WITH_MD.sub(lambda m: f"docs/reference/{m.group(1)}.md", text)
    return NUMBERED.sub(lambda m: f"docs/reference/{m.group(1)}.md", text)


def main():
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or [ROOT / d for d in ("src", "tests", "tools", "scripts", "bench", "docs")] + [ROOT / "README.md"]
    changed = 0
    for base in paths:
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file() and p.suffix in SUFFIXES]
        for f in files:
            if "docs/reference" in str(f) or "node_modules" in str(f) or "/corpus/" in str(f) or f.resolve() in SELF:
                continue
            old = f.read_text(encoding="utf-8", errors="surrogateescape")
            new = rewrite(old)
            if new != old:
                f.write_text(new, encoding="utf-8", errors="surrogateescape")
                changed += 1
    print(f"{changed} files rewritten")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Checks that need no build: every C++/CUDA file is formatted as .clang-format says (clang-format-16
# from Debian), and every comment cites documents that exist in this repository (docs/..., with the
# team's reference documents under docs/reference/). Prints what is wrong; exit status 1 if anything.
# Usage: scripts/lint.sh [--fix]   (--fix reformats in place and rewrites citations)
set -uo pipefail
cd "$(dirname "$0")/.."
FORMAT=${CLANG_FORMAT:-clang-format-16}
mapfile -t files < <(git ls-files 'src/**' 'tools/**' 'tests/**' 'bench/**' 'include/**' |
                     grep -E '\.(cpp|h|cu|cuh)$' | grep -v '^tests/fuzz/corpus/')
status=0
if [ "${1:-}" = "--fix" ]; then
  "$FORMAT" -i "${files[@]}"
  python3 tools/maint/cite_reference_docs.py
  exit 0
fi
unformatted=()
for f in "${files[@]}"; do
  "$FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if [ ${#unformatted[@]} -gt 0 ]; then
  echo "lint: ${#unformatted[@]} file(s) not formatted (scripts/lint.sh --fix):"
  printf '  %s\n' "${unformatted[@]}" | head -40
  status=1
fi
# Citations: a bare SPEC/SERVING/PERFORMANCE reference (the team's documents live outside the
# repository) or a docs/ path that does not exist.
bad_refs=$(git grep -nE '(^|[^/A-Za-z_])(SPEC|SERVING|PERFORMANCE)(\.md\b| ?[0-9])' -- src tools tests bench scripts README.md docs \
           ':!docs/reference' ':!tests/fuzz/corpus' ':!tools/maint/cite_reference_docs.py' ':!scripts/lint.sh' | head -20)
if [ -n "$bad_refs" ]; then
  echo "lint: citations of documents outside the repository (tools/maint/cite_reference_docs.py rewrites them):"
  echo "$bad_refs" | sed 's/^/  /'
  status=1
fi
# (docs/reference/ are the team's documents verbatim: their docs/... paths name other projects' files.)
missing=$(git grep -ohE 'docs/[A-Za-z0-9_./-]+\.md' -- src tools tests bench scripts README.md docs ':!tests/fuzz/corpus' ':!docs/reference' |
          sort -u | while read -r d; do [ -f "$d" ] || echo "$d"; done)
if [ -n "$missing" ]; then
  echo "lint: cited documents that do not exist:"
  echo "$missing" | sed 's/^/  /'
  status=1
fi
[ "$status" -eq 0 ] && echo "lint: ok (${#files[@]} files formatted, citations resolve)"
exit "$status"

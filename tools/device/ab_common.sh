# Sourced by the `ossrt bench cost` A/B scripts (decode_ab.sh, prefill_ab.sh) from the repo root, once
# DEADLINE_S is set: the pack and output paths, the library path, and the pieces of the variant loop.
START=$(date +%s)
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
mkdir -p "$FINAL"
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
left() { echo $((START + DEADLINE_S - $(date +%s))); }
# ab_variant label=VAR=value[,VAR=value]: sets label, settings and envs (the settings as an array for
# `env`) and prints the variant's header; returns 1 (saying so) when under 30 s of the deadline are left.
ab_variant() {
  label=${1%%=*}
  settings=${1#*=}
  [ "$(left)" -gt 30 ] || { echo "-- $label skipped: no time left"; return 1; }
  envs=()
  [ -n "$settings" ] && IFS=',' read -ra envs <<< "$settings"
  echo "== $label: ${settings:-(as is)}"
}
# ab_keep <file>: a result this run wrote into $FINAL, for ab_done to bundle.
AB_KEPT=()
ab_keep() { [ -f "$FINAL/$1" ] && AB_KEPT+=("$1"); }
# The device call returns only a few files of $OUT (a run of 9 variants lost two JSONs): ab_done
# bundles the run's results into one tarball, $OUT/${AB_BUNDLE:-ab_<start time>_<pid>}.tgz, and removes them.
ab_done() {
  echo "== done after $(( $(date +%s) - START )) s"
  [ ${#AB_KEPT[@]} -gt 0 ] || return 0
  local bundle=${AB_BUNDLE:-ab_${START}_$$}.tgz
  tar czf "$FINAL/$bundle" -C "$FINAL" "${AB_KEPT[@]}" && (cd "$FINAL" && rm -f "${AB_KEPT[@]}")
  echo "== results: \$OUT/$bundle (${#AB_KEPT[@]} files: tar xzf it into bench/results/<run>/<what>/)"
}

# Sourced by the hack/build-*.sh scripts that build a pinned release of a
# tool from its module source into the cache outside the git tree (the
# harness reads the same place: test/harness.CacheDir).
#
#   cache_init NAME VERSION   sets out=$cache/NAME/VERSION, work=$out/module
#   cache_has BINARY...       true when every binary is in $out/bin and
#                             $out/VERSION names $VERSION
#   cache_module MODULE       writes $work/go.mod requiring nothing yet
#   cache_install SRC BINARY  moves a finished build into $out/bin
#   cache_done                records $VERSION in $out/VERSION
cache="${FLOTILLA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla}"

cache_init() {
  cache_name="$1"
  cache_version="$2"
  out="$cache/$cache_name/$cache_version"
  work="$out/module"
}

cache_has() {
  [ "$(cat "$out/VERSION" 2>/dev/null)" = "$cache_version" ] || return 1
  local b
  for b in "$@"; do [ -x "$out/bin/$b" ] || return 1; done
}

# A build goes to a temporary name in $out/bin and is renamed by
# cache_install, so an interrupted build leaves no binary that looks
# complete.
cache_tmp() { mkdir -p "$out/bin"; echo "$out/bin/.$1.tmp"; }

cache_install() { mv "$out/bin/.$1.tmp" "$out/bin/$1"; }

cache_done() {
  echo "$cache_version" > "$out/VERSION"
  echo "$cache_name $cache_version ready in $out/bin"
}

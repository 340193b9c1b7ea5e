#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# kubelet and kube-proxy from one pinned k8s.io/kubernetes release into a
# cache outside the git tree. Only missing binaries are built; a second call
# with the same version does nothing.
set -euo pipefail
. "$(dirname "$0")/cache.sh"

version="${KUBE_VERSION:-$(cat "$(dirname "$0")/../test/harness/kube-version")}"
cache_init kube "$version"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

# A cache of another version (or an interrupted first build) starts over.
if [ "$(cat "$out/VERSION" 2>/dev/null)" != "$version" ]; then
  rm -rf "$out/bin"
fi
missing=()
for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} = 0 ]; then
  echo "kube binaries $version already in $out/bin"
  exit 0
fi

# The staging modules k8s.io/kubernetes replaces with ./staging/... are
# published as v0.<minor>.<patch>; a wrapper module pins each of them.
staging_version="v0.${version#v1.}"
mkdir -p "$work" "$out/bin"
mod="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
{
  echo "module flotilla.local/kubebuild"
  echo
  echo "go 1.24.0"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*|\1|p' "$mod" |
    while read -r m; do echo "	$m => $m $staging_version"; done
  echo ")"
} > "$work/go.mod"
{
  echo "//go:build tools"
  echo
  echo "package kubebuild"
  echo
  echo "import ("
  for b in "${bins[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
  echo ")"
} > "$work/tools.go"
cd "$work"
echo "building ${missing[*]} $version into $out/bin (first time: several minutes; kubelet alone about 5 on 2 cores)"
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
for b in "${missing[@]}"; do
  GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitVersion=$version" -o "$(cache_tmp "$b")" "k8s.io/kubernetes/cmd/$b"
  cache_install "$b"
done
cache_done

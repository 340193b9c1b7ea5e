#!/usr/bin/env bash
# Builds the helm CLI from one pinned helm.sh/helm/v3 release into the
# cache outside the git tree, for the tests that install charts/flotilla
# with helm itself. A second call with the same version does nothing.
set -euo pipefail
. "$(dirname "$0")/cache.sh"

cache_init helm "${HELM_VERSION:-$(cat "$(dirname "$0")/../test/harness/helm-version")}"
if cache_has helm; then
  echo "helm $cache_version already in $out/bin"
  exit 0
fi
mkdir -p "$work"
cat > "$work/go.mod" <<MOD
module flotilla.local/helmbuild

go 1.26.0

require helm.sh/helm/v3 $cache_version
MOD
cat > "$work/tools.go" <<'TOOLS'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
TOOLS
cd "$work"
echo "building helm $cache_version into $out/bin (first time: a few minutes on 2 cores)"
GOFLAGS=-mod=mod go mod tidy
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$cache_version" -o "$(cache_tmp helm)" helm.sh/helm/v3/cmd/helm
cache_install helm
cache_done

#!/usr/bin/env bash
# Builds flanneld from one pinned github.com/flannel-io/flannel release into
# a cache outside the git tree, for the test clusters that run flannel as
# their CNI. A second call with the same version does nothing.
#
# flannel's main package links every backend. The Tencent Cloud VPC
# backend's SDK module at the version flannel pins is not served by the
# module proxy this project builds from; an older release of the same
# module is, and is used instead (the tests use only the vxlan backend).
# The udp backend needs cgo; the binary is linked statically.
set -euo pipefail
. "$(dirname "$0")/cache.sh"

version="${FLANNEL_VERSION:-$(cat "$(dirname "$0")/../test/harness/flannel-version")}"
cache_init flannel "$version"
if cache_has flanneld; then
  echo "flanneld $version already in $out/bin"
  exit 0
fi
if ! command -v gcc >/dev/null; then
  echo "build-flannel: flanneld needs a C compiler: apt-get install -y gcc libc6-dev" >&2
  exit 1
fi
mkdir -p "$work"
cat > "$work/go.mod" <<MOD
module flotilla.local/flannelbuild

go 1.26.0

require github.com/flannel-io/flannel $version

replace github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc => github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc v1.0.1000
MOD
cat > "$work/tools.go" <<'TOOLS'
//go:build tools

package tools

import _ "github.com/flannel-io/flannel"
TOOLS
cd "$work"
echo "building flanneld $version into $out/bin (first time: a few minutes on 2 cores)"
GOFLAGS=-mod=mod go mod tidy
GOFLAGS=-mod=mod CGO_ENABLED=1 go build -trimpath -tags netgo,osusergo -ldflags "-s -w -extldflags -static -X github.com/flannel-io/flannel/pkg/version.Version=$version" -o "$(cache_tmp flanneld)" github.com/flannel-io/flannel
cache_install flanneld
cache_done

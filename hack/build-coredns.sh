#!/usr/bin/env bash
# Builds CoreDNS from one pinned github.com/coredns/coredns release into a
# cache outside the git tree, with only the plugins the test clusters' DNS
# uses (a main of our own, as CoreDNS documents for custom builds). A
# second call with the same version does nothing.
set -euo pipefail
. "$(dirname "$0")/cache.sh"

version="${COREDNS_VERSION:-$(cat "$(dirname "$0")/../test/harness/coredns-version")}"
cache_init coredns "$version"
if cache_has coredns; then
  echo "coredns $version already in $out/bin"
  exit 0
fi
mkdir -p "$work"
cat > "$work/go.mod" <<MOD
module flotilla.local/corednsbuild

go 1.26.0

require github.com/coredns/coredns $version
MOD
# The plugins in CoreDNS's own order (plugin.cfg): a Corefile runs them in
# this order whatever order it names them in.
cat > "$work/main.go" <<'MAIN'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func init() {
	dnsserver.Directives = []string{
		"reload", "ready", "health", "errors", "log", "loadbalance",
		"cache", "kubernetes", "loop", "forward", "whoami",
	}
}

func main() { coremain.Run() }
MAIN
cd "$work"
echo "building coredns $version into $out/bin (first time: a few minutes on 2 cores)"
GOFLAGS=-mod=mod go mod tidy
# Static: the image has no libc.
GOFLAGS=-mod=mod CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "-s -w" -o "$(cache_tmp coredns)" .
cache_install coredns
cache_done

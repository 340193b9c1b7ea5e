#!/usr/bin/env bash
# Copies Prometheus Operator's own CRDs of the kinds deploy/monitoring
# holds (PodMonitor, ServiceMonitor, PrometheusRule) from one pinned
# release of its module source into the cache outside the git tree, for
# the test that applies deploy/monitoring to a real API server. A second
# call with the same version does nothing.
set -euo pipefail
. "$(dirname "$0")/cache.sh"

cache_init prometheus-operator "${PROMETHEUS_OPERATOR_VERSION:-$(cat "$(dirname "$0")/../test/harness/prometheus-operator-version")}"
crds=(monitoring.coreos.com_podmonitors.yaml monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)
if [ "$(cat "$out/VERSION" 2>/dev/null)" = "$cache_version" ]; then
  echo "Prometheus Operator $cache_version CRDs already in $out/crds"
  exit 0
fi
mkdir -p "$work"
cat > "$work/go.mod" <<MOD
module flotilla.local/prometheusoperatorcrds

go 1.26.0
MOD
src="$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "github.com/prometheus-operator/prometheus-operator@$cache_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
if [ -z "$src" ]; then
  echo "fetch-prometheus-operator-crds: no module source of github.com/prometheus-operator/prometheus-operator@$cache_version" >&2
  exit 1
fi
rm -rf "$out/crds.tmp"
mkdir -p "$out/crds.tmp"
for f in "${crds[@]}"; do
  cp "$src/example/prometheus-operator-crd/$f" "$out/crds.tmp/$f"
done
cp "$src/LICENSE" "$out/crds.tmp/LICENSE"
rm -rf "$out/crds"
mv "$out/crds.tmp" "$out/crds"
chmod -R u+w "$out/crds"
echo "$cache_version" > "$out/VERSION"
echo "Prometheus Operator $cache_version CRDs ready in $out/crds"

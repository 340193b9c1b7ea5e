#!/usr/bin/env bash
# Installs what building, testing and the demo need on a Debian machine:
# Debian packages (only the missing ones; containerd, runc and the CNI
# plugins for real nodes among them), Go modules, the pinned Kubernetes
# binaries, kubelet and kube-proxy included, the test clusters' CoreDNS and
# flannel and kube-network-policies (all built from source into a cache
# outside the tree), and Prometheus Operator's CRDs (from its module source,
# into the same cache).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1; then
  echo "install-deps: no Go toolchain on PATH; install Go $(sed -n 's/^go //p' go.mod) or newer (https://go.dev/doc/install)" >&2
  exit 1
fi

# command -> Debian package
declare -A want=(
  [ip]=iproute2
  [ping]=iputils-ping
  [etcd]=etcd-server
  [nft]=nftables
  [wg]=wireguard-tools
  [iperf3]=iperf3
  [git]=git
  # Real nodes: the container runtime and its low-level runner.
  [containerd]=containerd
  [runc]=runc
  # The CNI masquerade shapes of iptables (nft backend) on real nodes.
  [iptables-nft-restore]=iptables
  # promtool checks and unit-tests deploy/monitoring's alert rules.
  [promtool]=prometheus
  # The dashboard's test looks at the page in a real headless browser.
  [chromium]=chromium
  # flanneld, one test cluster's CNI, links its udp backend with cgo.
  [gcc]=gcc
)
missing=()
for cmd in "${!want[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done
# The CNI plugins real nodes use (bridge, host-local, loopback, portmap).
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
# The mDNS interoperability test uses another implementation: Debian's
# python3-zeroconf, with Debian's own python3.
/usr/bin/python3 -c 'import zeroconf' >/dev/null 2>&1 || missing+=(python3-zeroconf)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The MCS conformance suite's images (test/conformance, in make test) are
# built from Debian packages that apt-get download fetches: it needs the
# package lists, which a fresh machine may not have.
if ! apt-cache show socat >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: no Debian package lists; run as root or: sudo apt-get update" >&2
    exit 1
  fi
  echo "install-deps: apt-get update (package lists for the conformance suite's images)"
  apt-get update -qq
fi

go mod download
(cd charts && go mod download)
bash hack/build-kube.sh
bash hack/build-coredns.sh
bash hack/build-flannel.sh
bash hack/build-helm.sh
bash hack/build-kube-network-policies.sh
bash hack/fetch-prometheus-operator-crds.sh

#!/usr/bin/env bash
# Builds kube-network-policies (sigs.k8s.io/kube-network-policies, the
# NetworkPolicy enforcer of Kubernetes' own test clusters) from one pinned
# release's module source into a cache outside the git tree, for the test
# clusters of real nodes that must enforce NetworkPolicy. A second call with
# the same version does nothing.
#
# Three changes to what upstream ships, for the machines the tests run on:
# - The kernel's nftables may lack the `queue` expression (CONFIG_NFT_QUEUE
#   unset) while it has nfnetlink_queue, nft_compat and the xtables NFQUEUE
#   target. The same verdict, "hand the packet to queue N, accept it if no
#   one listens" or not, is then written as the NFQUEUE target through
#   nft_compat (`nft list` shows it as `queue num N`); everything else is
#   upstream's code. Upstream's own `queue` is used where the kernel has it.
# - Its command reads only the in-cluster configuration of a pod; the
#   harness runs it as a process of the node, as kubelet and kube-proxy
#   run, so the main package here (a few lines around upstream's
#   controller, as its own cmd/main.go does) takes a kubeconfig.
# - Run without NRI (containerd 1.6 has none), upstream's controller looks a
#   packet's address that is no pod's up in the NRI plugin it does not
#   have, and dies (a nil pointer) at the first packet to a node, a Service
#   or the internet, after which the queue drops every packet it is handed;
#   such an address is looked up nowhere else, as upstream's pods without
#   NRI are.
#
# The pinned version names the changes too (v0.8.0-flotilla.2: upstream's
# v0.8.0, changed as above), so that a build of earlier changes in the
# cache is not taken for this one.
set -euo pipefail

. "$(dirname "$0")/cache.sh"

version="${KUBE_NETWORK_POLICIES_VERSION:-$(cat "$(dirname "$0")/../test/harness/kube-network-policies-version")}"
upstream_version="${version%%-flotilla.*}"
cache_init kube-network-policies "$version"
if cache_has kube-network-policies; then
  echo "kube-network-policies $version already in $out/bin"
  exit 0
fi
rm -rf "$work"
mkdir -p "$work/cmd" "$out/bin"
src="$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kube-network-policies@$upstream_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
if [ -z "$src" ] || [ ! -d "$src" ]; then
  echo "build-kube-network-policies: the module proxy did not serve sigs.k8s.io/kube-network-policies@$upstream_version" >&2
  exit 1
fi
cp -r "$src" "$work/upstream"
chmod -R u+w "$work/upstream"
pkg="$work/upstream/pkg/networkpolicy"
# The queue verdict through nft_compat where the kernel has no nft_queue.
sed -i \
  -e 's/queue := &expr.Queue{Num: uint16(c.config.QueueID)}/var queue expr.Any = nfqueueVerdict(uint16(c.config.QueueID), c.config.FailOpen)/' \
  -e 's/^\(\s*\)queue.Flag = expr.QueueFlagBypass$/\1_ = "bypass set above"/' \
  "$pkg/controller.go"
sed -i -e 's/&expr.Queue{Num: uint16(n.nfQueueID), Flag: expr.QueueFlagBypass}/nfqueueVerdict(uint16(n.nfQueueID), true)/' "$pkg/dnsagent.go"
if grep -q 'expr.Queue{' "$pkg/controller.go" "$pkg/dnsagent.go"; then
  echo "build-kube-network-policies: $version writes the queue verdict somewhere this script does not know; update the script" >&2
  exit 1
fi
# An address that is no pod's, without NRI: no pod.
sed -i -e 's/^\(\s*\)podKey := c.nriPlugin.GetPodFromIP(podIP)$/\1if c.nriPlugin == nil {\n\1\treturn nil\n\1}\n&/' "$pkg/controller.go"
if ! grep -q 'if c.nriPlugin == nil {' "$pkg/controller.go"; then
  echo "build-kube-network-policies: $upstream_version looks pods up in NRI somewhere this script does not know; update the script" >&2
  exit 1
fi
cat > "$pkg/nfqueue_compat.go" <<'GO'
package networkpolicy

import (
	"encoding/binary"
	"os"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// nfqueueVerdict hands a packet to queue num: nftables' own queue
// expression where the kernel has it (nft_queue), else the xtables NFQUEUE
// target (revision 3) through nft_compat, which the same kernels build in.
func nfqueueVerdict(num uint16, bypass bool) expr.Any {
	if kernelHasNFTQueue() {
		q := &expr.Queue{Num: num}
		if bypass {
			q.Flag = expr.QueueFlagBypass
		}
		return q
	}
	// struct xt_NFQ_info_v3 { __u16 queuenum, queues_total, flags; },
	// host byte order, padded to 8 bytes.
	info := make(xt.Unknown, 8)
	binary.NativeEndian.PutUint16(info[0:], num)
	binary.NativeEndian.PutUint16(info[2:], 1)
	if bypass {
		binary.NativeEndian.PutUint16(info[4:], 1) // NFQ_FLAG_BYPASS
	}
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}

// kernelHasNFTQueue says whether the kernel's configuration, where it is
// published, has the nftables queue expression.
func kernelHasNFTQueue() bool {
	if v := os.Getenv("KNP_NFT_QUEUE"); v != "" {
		return v == "true"
	}
	b, err := readKernelConfig()
	if err != nil {
		return true // upstream's behaviour
	}
	return strings.Contains(b, "\nCONFIG_NFT_QUEUE=")
}
GO
cat > "$pkg/kconfig_compat.go" <<'GO'
package networkpolicy

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
)

// readKernelConfig is the running kernel's configuration
// (/proc/config.gz).
func readKernelConfig() (string, error) {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return "", err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	b.WriteByte('\n')
	if _, err := io.Copy(&b, z); err != nil {
		return "", err
	}
	return b.String(), nil
}
GO
cat > "$work/go.mod" <<MOD
module flotilla.local/knpbuild

go 1.26.0

require sigs.k8s.io/kube-network-policies $upstream_version

replace sigs.k8s.io/kube-network-policies => ./upstream
MOD
cat > "$work/cmd/main.go" <<'GO'
// Command kube-network-policies is upstream's controller as its
// cmd/main.go runs it, with a kubeconfig instead of the in-cluster
// configuration, NRI off and no admin network policies.
package main

import (
	"context"
	"flag"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	node := flag.String("hostname-override", "", "the Node this runs on")
	queueID := flag.Int("nfqueue-id", 100, "number of the nfqueue used")
	failOpen := flag.Bool("fail-open", false, "accept packets while the controller does not run")
	metrics := flag.String("metrics-bind-address", "", "address of /metrics; empty: none")
	klog.InitFlags(nil)
	flag.Parse()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, unix.SIGTERM)
	defer cancel()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig %s: %v", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(), factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{
			FailOpen: *failOpen, QueueID: *queueID, NodeName: *node, NRIdisabled: true,
			// Kernels from 6.12 on need no DNS workaround.
			NetfilterBug1766Fix: false,
		})
	if err != nil {
		klog.Fatalf("controller: %v", err)
	}
	if *metrics != "" {
		http.Handle("/metrics", promhttp.Handler())
		go func() { klog.Error(http.ListenAndServe(*metrics, nil)) }()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil {
			klog.Error(err)
		}
	}()
	factory.Start(ctx.Done())
	<-ctx.Done()
	// Upstream's grace period: the controller removes its table.
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}
GO
cd "$work"
echo "building kube-network-policies $version into $out/bin (first time: a few minutes on 2 cores)"
GOFLAGS=-mod=mod go mod tidy
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$(cache_tmp kube-network-policies)" ./cmd
cache_install kube-network-policies
cache_done

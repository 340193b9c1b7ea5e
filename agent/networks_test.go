package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/test/harness"
)

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// The agent finds its networks where real clusters keep them, and says
// which flag to set when it cannot.
func TestDetectNetworks(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	ctx := context.Background()
	// A control plane with no pod range: no node gets spec.podCIDRs.
	bare := env.ControlPlane("bare", harness.ControlPlaneOptions{ServiceCIDR: netip.MustParsePrefix("10.97.0.0/16")})

	t.Run("flags win", func(t *testing.T) {
		n, err := detectNetworks(ctx, bare.Client, prefixes("10.1.0.0/16"), prefixes("10.2.0.0/16"))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(n.Pods, prefixes("10.1.0.0/16")) || !slices.Equal(n.Services, prefixes("10.2.0.0/16")) {
			t.Fatalf("got %+v", n)
		}
	})
	t.Run("no pod range anywhere: the error names the flag", func(t *testing.T) {
		_, err := detectNetworks(ctx, bare.Client, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "--pod-cidr") {
			t.Fatalf("err = %v, want one naming --pod-cidr", err)
		}
	})
	t.Run("service range from the ServiceCIDR objects", func(t *testing.T) {
		n, err := detectNetworks(ctx, bare.Client, prefixes("10.1.0.0/16"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(n.Services, prefixes("10.97.0.0/16")) || n.ServiceSource != "ServiceCIDR objects" {
			t.Fatalf("services %v from %s, want 10.97.0.0/16 from the ServiceCIDR objects", n.Services, n.ServiceSource)
		}
	})
	t.Run("kubeadm-config", func(t *testing.T) {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-config", Namespace: "kube-system"},
			Data: map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n" +
				"networking:\n  podSubnet: 10.244.0.0/16,fd00:10:244::/56\n  serviceSubnet: 10.97.0.0/16\n"},
		}
		if _, err := bare.Client.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer bare.Client.CoreV1().ConfigMaps("kube-system").Delete(ctx, cm.Name, metav1.DeleteOptions{})
		n, err := detectNetworks(ctx, bare.Client, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(n.Pods, prefixes("10.244.0.0/16", "fd00:10:244::/56")) || n.PodSource != "kubeadm-config" {
			t.Fatalf("pods %v from %s", n.Pods, n.PodSource)
		}
	})
	t.Run("nodes' pod ranges", func(t *testing.T) {
		cp := env.ControlPlane("alloc", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.50.0.0/16")})
		k1 := cp.StartKubelet("n1", harness.KubeletOptions{})
		k2 := cp.StartKubelet("n2", harness.KubeletOptions{})
		n, err := detectNetworks(ctx, cp.Client, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := []netip.Prefix{k1.PodCIDR(), k2.PodCIDR()}
		slices.SortFunc(want, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		got := slices.Clone(n.Pods)
		slices.SortFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		if !slices.Equal(got, want) {
			t.Fatalf("pods %v, want the nodes' ranges %v", n.Pods, want)
		}
	})
}

func TestParseCIDR(t *testing.T) {
	for _, tt := range []struct {
		in, errHas string
	}{
		{"10.0.0.0/16", ""},
		{"fd00::/64", ""},
		{"10.0.0.1/16", "the network is 10.0.0.0/16"},
		{"0.0.0.0/0", "whole address space"},
		{"10.0.0.0", "CIDR"},
		{"banana", "CIDR"},
	} {
		_, err := ParseCIDR(tt.in)
		if (err == nil) != (tt.errHas == "") || (err != nil && !strings.Contains(err.Error(), tt.errHas)) {
			t.Errorf("ParseCIDR(%q) = %v, want error containing %q", tt.in, err, tt.errHas)
		}
	}
}

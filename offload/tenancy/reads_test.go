package tenancy

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
)

// A new tenant and a new namespace mirrored for it are made by writes
// alone: no read before a create (the create answers whether one
// exists), and what the fence denies is read once, not per namespace.
// The writes are checked too, so that a tenant made of nothing does not
// pass.
func (s *suite) testWithoutReads(t *testing.T) {
	var mu sync.Mutex
	var reads, writes []string
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			if r.Method == http.MethodGet {
				reads = append(reads, r.URL.Path)
			} else {
				writes = append(writes, r.Method+" "+r.URL.Path)
			}
			mu.Unlock()
			return rt.RoundTrip(r)
		})
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := NewTenants(TenantsConfig{
		Config: cfg, Client: client, Audience: offloadtest.AcceptedAudience,
		PodNetworks: func(context.Context) ([]netip.Prefix, error) {
			return []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	taken := func() (r, w []string) {
		mu.Lock()
		defer mu.Unlock()
		r, w, reads, writes = reads, writes, nil, nil
		return r, w
	}
	ctx := t.Context()
	first := offloadtest.NewConsumer(t)
	t.Cleanup(func() { _ = s.tenants.Remove(context.Background(), first) })
	if _, err := tenants.Ensure(ctx, first, grant.Limits{CPU: "1"}); err != nil {
		t.Fatal(err)
	}
	if r, _ := taken(); len(r) == 0 {
		t.Fatalf("the first tenant read nothing: the fence's addresses (nodes, the API server) were not read")
	}

	second := offloadtest.NewConsumer(t)
	t.Cleanup(func() { _ = s.tenants.Remove(context.Background(), second) })
	if _, err := tenants.Ensure(ctx, second, grant.Limits{CPU: "1"}); err != nil {
		t.Fatal(err)
	}
	r, w := taken()
	if len(r) != 0 {
		t.Errorf("a new tenant read %v; want writes alone", r)
	}
	if !slices.Contains(w, "POST /api/v1/namespaces") {
		t.Errorf("a new tenant wrote %v; want its namespace created", w)
	}

	name := "shop-" + offload.ClusterSuffix(second)
	ns, fence, created, err := tenants.EnsureMirrored(ctx, second, name, "shop", grant.Limits{CPU: "1"}, nil)
	if err != nil || !created || fence.ResourceVersion == "" || fence.Generation == 0 {
		t.Fatalf("EnsureMirrored(%s) = created %v, fence %+v, %v; want created with its fence", name, created, fence, err)
	}
	r, _ = taken()
	if len(r) != 0 {
		t.Errorf("a new mirrored namespace read %v; want writes alone", r)
	}
	pol, err := s.cp.Client.NetworkingV1().NetworkPolicies(ns.Name).Get(ctx, FencePolicy, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the fence of %s: %v", ns.Name, err)
	}
	if pol.ResourceVersion != fence.ResourceVersion {
		t.Errorf("fence resourceVersion %s, EnsureMirrored said %s", pol.ResourceVersion, fence.ResourceVersion)
	}
}

// withTenants is s with Tenants of its own, whose fences read what they
// deny at most refresh before (DefaultFenceRefresh when 0).
func (s *suite) withTenants(t *testing.T, refresh time.Duration, dns ...netip.Addr) *suite {
	t.Helper()
	tenants, err := NewTenants(TenantsConfig{Config: s.cp.Config, Client: s.cp.Client, Audience: offloadtest.AcceptedAudience, FenceRefresh: refresh, DNSAddresses: dns})
	if err != nil {
		t.Fatal(err)
	}
	return &suite{cp: s.cp, tenants: tenants, issued: s.issued}
}

// A node added after a fence's addresses were read is denied in the
// fences applied once FenceRefresh has passed: the cache holds them no
// longer than that.
func (s *suite) testFenceRefresh(t *testing.T) {
	ctx := t.Context()
	s = s.withTenants(t, time.Second)
	first := offloadtest.NewConsumer(t)
	t.Cleanup(func() { _ = s.tenants.Remove(context.Background(), first) })
	s.ensure(t, first, grant.Limits{})

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "refresh-node-" + first[:8]}}
	if _, err := s.cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cp.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.99"}}
	if _, err := s.cp.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "the node added denied by the fence", func() error {
		s.ensure(t, first, grant.Limits{})
		pol, err := s.cp.Client.NetworkingV1().NetworkPolicies(offload.TenantNamespace(first)).Get(ctx, FencePolicy, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, r := range pol.Spec.Egress {
			for _, p := range r.To {
				if p.IPBlock != nil && slices.Contains(p.IPBlock.Except, "192.0.2.99/32") {
					return nil
				}
			}
		}
		return fmt.Errorf("the fence of %s does not deny the node added, 192.0.2.99", first)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

package agent

import (
	"context"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/tunnel"
)

// A Peer's spec.traffic wins; empty follows --traffic.
func TestTrafficMode(t *testing.T) {
	for _, tc := range []struct {
		spec v1alpha1.Traffic
		def  policy.Mode
		want policy.Mode
	}{
		{"", policy.Full, policy.Full},
		{"", policy.Segregated, policy.Segregated},
		{v1alpha1.TrafficFull, policy.Segregated, policy.Full},
		{v1alpha1.TrafficSegregated, policy.Full, policy.Segregated},
	} {
		p := &v1alpha1.Peer{Spec: v1alpha1.PeerSpec{Traffic: tc.spec}}
		if got := trafficMode(p, tc.def); got != tc.want {
			t.Errorf("spec %q, --traffic %s: %s, want %s", tc.spec, tc.def, got, tc.want)
		}
	}
}

// The pods of a consumer are those in namespaces labelled as its tenant's
// by us, with an IP of their own.
func TestOffloadedPods(t *testing.T) {
	ns := func(name, tenant string, ours bool) corev1.Namespace {
		l := map[string]string{offload.LabelTenant: tenant}
		if ours {
			l[v1alpha1.LabelManagedBy] = v1alpha1.ManagedByValue
		}
		return corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	pod := func(ns, ip string, hostNet bool) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns},
			Spec:   corev1.PodSpec{HostNetwork: hostNet},
			Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: ip}}}}
	}
	got := offloadedPods(
		[]corev1.Namespace{ns("b-shop", "b", true), ns("c-web", "c", true), ns("forged", "b", false)},
		[]corev1.Pod{
			pod("b-shop", "10.0.1.5", false),
			pod("b-shop", "192.168.0.10", true), // hostNetwork: the node's address
			pod("c-web", "10.0.2.7", false),
			pod("c-web", "fd00::7", false),
			pod("forged", "10.0.3.3", false), // a namespace not ours
			pod("default", "10.0.4.4", false),
		})
	want := map[string][]netip.Addr{
		"b": {netip.MustParseAddr("10.0.1.5")},
		"c": {netip.MustParseAddr("10.0.2.7")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("offloadedPods = %v, want %v", got, want)
	}
}

// recordingDataplane keeps what was applied.
type recordingDataplane struct {
	applied []tunnel.Desired
}

func (r *recordingDataplane) Apply(_ context.Context, d tunnel.Desired) error {
	r.applied = append(r.applied, d)
	return nil
}
func (r *recordingDataplane) Status() ([]tunnel.PeerStatus, error) { return nil, nil }
func (r *recordingDataplane) PublicKey() tunnel.Key                { return tunnel.Key{} }

// Every desired state applied carries the Segregated peers' sets; a new
// decision applies the last state again, an unchanged one does not, and
// bad input changes nothing.
func TestSegregatingDataplane(t *testing.T) {
	rec := &recordingDataplane{}
	s := &segregatingDataplane{Dataplane: rec}
	ctx := context.Background()
	d := tunnel.Desired{Peers: []tunnel.Peer{{ClusterID: "b"}, {ClusterID: "c"}}}
	pod := netip.MustParseAddr("10.0.1.5")
	in := trafficInput{
		Modes: map[string]policy.Mode{"b": policy.Segregated, "c": policy.Full},
		Pods:  map[string][]netip.Addr{"b": {pod}, "c": {netip.MustParseAddr("10.0.2.7")}},
	}
	if err := s.setInput(ctx, in); err != nil {
		t.Fatal(err)
	}
	if len(rec.applied) != 0 {
		t.Fatalf("applied %d states before the engine applied any", len(rec.applied))
	}
	if err := s.Apply(ctx, d); err != nil {
		t.Fatal(err)
	}
	segregated := func(i int) map[string]*policy.Sets {
		out := map[string]*policy.Sets{}
		for _, p := range rec.applied[i].Peers {
			out[p.ClusterID] = p.Segregated
		}
		return out
	}
	if got := segregated(0); got["c"] != nil || got["b"] == nil || !reflect.DeepEqual(got["b"].Pods, []netip.Addr{pod}) {
		t.Fatalf("applied %+v; want b Segregated to its pod, c Full", got)
	}
	if d.Peers[0].Segregated != nil {
		t.Errorf("the engine's desired state was changed")
	}

	if err := s.setInput(ctx, in); err != nil || len(rec.applied) != 1 {
		t.Errorf("same input: %v, %d applies; want no new apply", err, len(rec.applied))
	}
	in.Modes["b"] = policy.Full
	if err := s.setInput(ctx, in); err != nil || len(rec.applied) != 2 {
		t.Fatalf("b back to Full: %v, %d applies; want one more", err, len(rec.applied))
	}
	if got := segregated(1); got["b"] != nil {
		t.Errorf("b back to Full still Segregated: %+v", got["b"])
	}
	in.Modes["b"] = policy.Segregated
	in.Pods["b"] = []netip.Addr{netip.MustParseAddr("fd00::1")}
	if err := s.setInput(ctx, in); err == nil || len(rec.applied) != 2 {
		t.Errorf("IPv6 pod: %v, %d applies; want an error and nothing applied", err, len(rec.applied))
	}
}

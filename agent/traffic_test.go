package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
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
// by us, with an IP of their own, still running; an IPv6 address is named
// as a problem and the pod's IPv4 one kept.
func TestOffloadedPods(t *testing.T) {
	ns := func(name, tenant string, ours bool) corev1.Namespace {
		l := map[string]string{offload.LabelTenant: tenant}
		if ours {
			l[v1alpha1.LabelManagedBy] = v1alpha1.ManagedByValue
		}
		return corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	pod := func(ns, name string, hostNet bool, phase corev1.PodPhase, ips ...string) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{HostNetwork: hostNet}, Status: corev1.PodStatus{Phase: phase}}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	got, problems := offloadedPods(
		[]corev1.Namespace{ns("b-shop", "b", true), ns("c-web", "c", true), ns("forged", "b", false)},
		[]corev1.Pod{
			pod("b-shop", "web", false, corev1.PodRunning, "10.0.1.5"),
			pod("b-shop", "agent", true, corev1.PodRunning, "192.168.0.10"), // the node's address
			pod("b-shop", "done", false, corev1.PodSucceeded, "10.0.1.6"),   // its IP released
			pod("c-web", "dual", false, corev1.PodRunning, "10.0.2.7", "fd00::7"),
			pod("forged", "x", false, corev1.PodRunning, "10.0.3.3"), // a namespace not ours
			pod("default", "y", false, corev1.PodRunning, "10.0.4.4"),
		})
	want := map[string][]netip.Addr{
		"b": {netip.MustParseAddr("10.0.1.5")},
		"c": {netip.MustParseAddr("10.0.2.7")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("offloadedPods = %v, want %v", got, want)
	}
	if len(problems) != 1 || problems[0].Object != "Pod c-web/dual" || !strings.Contains(problems[0].Err.Error(), "IPv4 only") {
		t.Errorf("problems = %v; want one naming Pod c-web/dual's IPv6 address", problems)
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

// segregated is what the i-th state applied makes each peer: nil Full.
func (r *recordingDataplane) segregated(i int) map[string]*policy.Sets {
	out := map[string]*policy.Sets{}
	for _, p := range r.applied[i].Peers {
		out[p.ClusterID] = p.Segregated
	}
	return out
}

// Until the first input, what the kernel held at start is applied, not
// Full (which would open the peer) nor empty sets (which would drop what
// is allowed); then every desired state applied carries the decision; a
// new decision applies the last state again, an unchanged one does not.
func TestSegregatingDataplane(t *testing.T) {
	rec := &recordingDataplane{}
	pod := netip.MustParseAddr("10.0.1.5")
	heldSets := policy.Sets{Peer: "b", Pods: []netip.Addr{netip.MustParseAddr("10.0.1.9")}}
	s := newSegregatingDataplane(rec, []policy.Sets{heldSets, {Peer: "gone"}}, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	d := tunnel.Desired{Peers: []tunnel.Peer{{ClusterID: "b"}, {ClusterID: "c"}}}
	if err := s.Apply(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got := rec.segregated(0); got["c"] != nil || got["b"] == nil || !got["b"].Equal(heldSets) {
		t.Fatalf("before the first input: applied %v; want b held to %v, c Full", got, heldSets)
	}
	if d.Peers[0].Segregated != nil {
		t.Errorf("the engine's desired state was changed")
	}

	in := trafficInput{
		Default: policy.Full,
		Modes:   map[string]policy.Mode{"b": policy.Segregated},
		Pods:    map[string][]netip.Addr{"b": {pod}, "c": {netip.MustParseAddr("10.0.2.7")}},
		Exported: []policy.Service{{Name: "shop/api", Addresses: []netip.Addr{netip.MustParseAddr("10.0.9.9")},
			Ports: []policy.Port{{Protocol: policy.TCP, Port: 8080}}}},
	}
	if applied, err := s.setInput(ctx, in); err != nil || !applied {
		t.Fatalf("first input: %v, applied %v; want applied", err, applied)
	}
	got := rec.segregated(1)
	if got["c"] != nil || got["b"] == nil || !reflect.DeepEqual(got["b"].Pods, []netip.Addr{pod}) ||
		!reflect.DeepEqual(got["b"].Services, []policy.Endpoint{{Addr: netip.MustParseAddr("10.0.9.9"), Protocol: policy.TCP, Port: 8080}}) {
		t.Fatalf("first input: applied %v; want b Segregated to its pod and the export, c Full", got)
	}
	if applied, err := s.setInput(ctx, in); err != nil || applied || len(rec.applied) != 2 {
		t.Errorf("same input: %v, applied %v, %d applies; want no new apply", err, applied, len(rec.applied))
	}
	// --traffic=Segregated: c follows it, and gets the export too.
	in.Default = policy.Segregated
	if _, err := s.setInput(ctx, in); err != nil || len(rec.applied) != 3 {
		t.Fatalf("default Segregated: %v, %d applies; want one more", err, len(rec.applied))
	}
	if got := rec.segregated(2); got["c"] == nil || len(got["c"].Pods) != 1 || len(got["c"].Services) != 1 {
		t.Errorf("default Segregated: c is %v; want its pod and the export", got["c"])
	}
	in.Modes["b"] = policy.Full
	if _, err := s.setInput(ctx, in); err != nil || len(rec.applied) != 4 {
		t.Fatalf("b to Full: %v, %d applies; want one more", err, len(rec.applied))
	}
	if got := rec.segregated(3); got["b"] != nil {
		t.Errorf("b to Full still Segregated: %+v", got["b"])
	}
	// The engine's next state carries the decision too.
	if err := s.Apply(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got := rec.segregated(4); got["b"] != nil || got["c"] == nil {
		t.Errorf("engine's apply after the input: %v; want b Full, c Segregated", got)
	}
}

package policyapi

import (
	"context"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

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
	s := NewSegregatingDataplane(rec, []policy.Sets{heldSets, {Peer: "gone"}}, slog.New(slog.DiscardHandler))
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

// What a Segregated peer may reach, from the objects: a provider the
// Services of the namespaces offloaded to it (their slices' addresses on
// their ports), every peer the exported Services; what the Reflector and
// the exporter leave out is left out here too; bad parts of a slice are
// named and the rest kept.
func TestTrafficInputOf(t *testing.T) {
	tcp, udp, sctp := corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
	weird := corev1.Protocol("QUIC")
	port := func(p int32, proto *corev1.Protocol) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Port: &p, Protocol: proto}
	}
	slice := func(ns, name, svc string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, addrs ...string) discoveryv1.EndpointSlice {
		es := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: at, Ports: ports}
		for _, a := range addrs {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
		}
		return es
	}
	svc := func(ns, name string, labels map[string]string) corev1.Service {
		return corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	offloaded := func(ns string, providers ...string) v1alpha1.NamespaceOffload {
		o := v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"}}
		for _, p := range providers {
			o.Status.Clusters = append(o.Status.Clusters, v1alpha1.ClusterOffload{ClusterID: p, RemoteNamespace: ns + "-" + p})
		}
		return o
	}
	reflected := slice("shop", "api-1", "api", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{port(8080, &tcp), port(53, &udp)}, "10.0.1.1", "10.70.0.9")
	objs := trafficObjects{
		Services: []corev1.Service{
			svc("shop", "api", nil),
			svc("shop", "mirror", map[string]string{offload.LabelReflected: "true"}), // reflected here: never sent on
			svc("web", "front", nil),
			svc("default", "kubernetes", nil),
		},
		Slices: []discoveryv1.EndpointSlice{
			reflected,
			slice("shop", "mirror-1", "mirror", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(80, &tcp)}, "10.0.1.2"),
			slice("web", "front-1", "front", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{port(443, nil), port(9, &weird), port(0, &tcp), {Protocol: &sctp}}, "10.0.2.1", "fd00::1"),
			slice("web", "front-2", "front", discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{port(443, &tcp)}, "fd00::2"),
			slice("default", "kubernetes", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(6443, &tcp)}, "192.0.2.1"),
			slice("other", "x-1", "x", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(80, &tcp)}, "10.0.3.1"),
		},
		Offloads: []v1alpha1.NamespaceOffload{offloaded("shop", "p"), offloaded("default", "p")},
		Exports:  []mcsv1alpha1.ServiceExport{{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "front"}}},
		Peers: []v1alpha1.Peer{
			{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.PeerSpec{Traffic: v1alpha1.TrafficSegregated}},
			{ObjectMeta: metav1.ObjectMeta{Name: "q"}},
		},
	}
	in, problems := trafficInputOf(objs, policy.Full)
	if in.mode("p") != policy.Segregated || in.mode("q") != policy.Full || in.mode("unknown") != policy.Full {
		t.Errorf("modes %v, default %s; want p Segregated, q and unknown Full", in.Modes, in.Default)
	}
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	wantReflected := []policy.Service{{Name: "shop/api", Addresses: addrs("10.0.1.1", "10.70.0.9"),
		Ports: []policy.Port{{Protocol: policy.TCP, Port: 8080}, {Protocol: policy.UDP, Port: 53}}}}
	if !reflect.DeepEqual(in.Reflected, map[string][]policy.Service{"p": wantReflected}) {
		t.Errorf("reflected %+v; want p: %+v", in.Reflected, wantReflected)
	}
	// The IPv4 slice keeps its good address and port; the IPv6 slice is
	// left out, named.
	wantExported := []policy.Service{
		{Name: "web/front", Addresses: addrs("10.0.2.1"), Ports: []policy.Port{{Protocol: policy.TCP, Port: 443}}},
		{Name: "web/front"},
	}
	if !reflect.DeepEqual(in.Exported, wantExported) {
		t.Errorf("exported %+v; want %+v", in.Exported, wantExported)
	}
	var named []string
	for _, p := range problems {
		named = append(named, p.Object+": "+p.Err.Error())
	}
	for _, want := range []string{
		`EndpointSlice web/front-1: port: protocol "QUIC"`,
		"EndpointSlice web/front-1: port: port 0",
		"EndpointSlice web/front-1: port: no port number",
		"EndpointSlice web/front-1: address fd00::1: the tunnel carries IPv4 only",
		"EndpointSlice web/front-2: address type IPv6",
	} {
		if !slices.ContainsFunc(named, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("problems %q lack %q", named, want)
		}
	}
	if len(named) != 5 {
		t.Errorf("%d problems, want 5: %q", len(named), named)
	}
	sets, err := policy.Decide([]policy.Peer{in.peer("p"), in.peer("q")})
	if err != nil {
		t.Fatalf("policy refuses the input: %v", err)
	}
	if len(sets) != 1 || len(sets[0].Services) != 5 {
		t.Errorf("decided %+v; want p alone with 2x2 reflected + 1 exported endpoints", sets)
	}
}

// Updates that cannot change a decision (a pod's or Peer's status written
// for other reasons, a ServiceExport's conditions) wake nothing; those
// that can do.
func TestChangedForTraffic(t *testing.T) {
	pod := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.1.5"}}}}
	// The feed's informer hands over what podForTraffic kept of a pod.
	kept := func(p *corev1.Pod) any { o, _ := podForTraffic(p); return o }
	podWith := func(f func(*corev1.Pod)) any { p := pod.DeepCopy(); f(p); return kept(p) }
	peer := &v1alpha1.Peer{Spec: v1alpha1.PeerSpec{Traffic: v1alpha1.TrafficSegregated}}
	peerWith := func(f func(*v1alpha1.Peer)) *v1alpha1.Peer { p := peer.DeepCopy(); f(p); return p }
	offload := &v1alpha1.NamespaceOffload{Status: v1alpha1.NamespaceOffloadStatus{Clusters: []v1alpha1.ClusterOffload{{ClusterID: "p", RemoteNamespace: "shop-p"}}}}
	offloadWith := func(f func(*v1alpha1.NamespaceOffload)) *v1alpha1.NamespaceOffload {
		o := offload.DeepCopy()
		f(o)
		return o
	}
	now := metav1.Now()
	for _, tc := range []struct {
		what     string
		old, new any
		want     bool
	}{
		{"pod status, same addresses", kept(pod), podWith(func(p *corev1.Pod) { p.ResourceVersion = "2" }), false},
		{"pod address", kept(pod), podWith(func(p *corev1.Pod) { p.Status.PodIPs[0].IP = "10.0.1.6" }), true},
		{"pod ended", kept(pod), podWith(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), true},
		{"pod on the host's network", kept(pod), podWith(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), true},
		{"Peer status", peer, peerWith(func(p *v1alpha1.Peer) { p.Status.Phase = v1alpha1.PhaseConnected }), false},
		{"Peer mode", peer, peerWith(func(p *v1alpha1.Peer) { p.Spec.Traffic = v1alpha1.TrafficFull }), true},
		{"Peer traffic status", peer, peerWith(func(p *v1alpha1.Peer) { p.Status.Traffic = v1alpha1.TrafficFull }), true},
		{"export conditions", &mcsv1alpha1.ServiceExport{}, &mcsv1alpha1.ServiceExport{Status: mcsv1alpha1.ServiceExportStatus{Conditions: []metav1.Condition{{Type: "Valid"}}}}, false},
		{"export deleted", &mcsv1alpha1.ServiceExport{}, &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, true},
		{"offload phase", offload, offloadWith(func(o *v1alpha1.NamespaceOffload) { o.Status.Phase = v1alpha1.OffloadReady }), false},
		{"offload to another", offload, offloadWith(func(o *v1alpha1.NamespaceOffload) { o.Status.Clusters[0].ClusterID = "q" }), true},
		{"namespace labels", &corev1.Namespace{}, tenantNamespace("x", "b"), true},
		{"slice", &discoveryv1.EndpointSlice{}, &discoveryv1.EndpointSlice{}, true},
	} {
		if got := changedForTraffic(tc.old, tc.new); got != tc.want {
			t.Errorf("%s: changedForTraffic = %v, want %v", tc.what, got, tc.want)
		}
	}
}

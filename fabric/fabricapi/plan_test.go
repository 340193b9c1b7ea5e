package fabricapi

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/fabric"
	"github.com/flotilla-io/flotilla/ha"
)

func testPlan() Plan {
	return Plan{
		GatewayNode: "gw", Gateway: netip.MustParseAddr("198.18.0.2"),
		TunnelInterface: "flotilla0", MTU: 1420,
		Views: []netip.Prefix{netip.MustParsePrefix("10.71.0.0/16"), netip.MustParsePrefix("10.70.0.0/16")},
		Nodes: []Node{
			{Name: "w1", Addr: netip.MustParseAddr("198.18.0.3"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}},
			{Name: "gw", Addr: netip.MustParseAddr("198.18.0.2"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}},
			{Name: "new"}, // not yet given an address or a block
		},
	}
}

func TestPlanRoundTrip(t *testing.T) {
	p := testPlan()
	b, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePlan(b)
	if err != nil {
		t.Fatalf("ParsePlan(%s): %v", b, err)
	}
	if got.Views[0] != netip.MustParsePrefix("10.70.0.0/16") || got.Nodes[0].Name != "gw" {
		t.Errorf("Marshal does not sort: views %v, nodes %v", got.Views, got.Nodes)
	}
	// The same plan in another order is the same ConfigMap.
	p.Views[0], p.Views[1] = p.Views[1], p.Views[0]
	p.Nodes[0], p.Nodes[1] = p.Nodes[1], p.Nodes[0]
	if b2, _ := p.Marshal(); string(b2) != string(b) {
		t.Errorf("Marshal depends on order:\n%s\n%s", b, b2)
	}
}

func TestPlanForNode(t *testing.T) {
	p := testPlan()
	gw := p.For("gw")
	want := fabric.Desired{Role: fabric.Gateway, Addr: p.Gateway, Views: p.Views, TunnelInterface: "flotilla0",
		Nodes: []fabric.Node{{Addr: netip.MustParseAddr("198.18.0.3"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}}}}
	if !reflect.DeepEqual(gw, want) {
		t.Errorf("gateway's part:\n got %+v\nwant %+v", gw, want)
	}
	w := p.For("w1")
	want = fabric.Desired{Role: fabric.Worker, Addr: netip.MustParseAddr("198.18.0.3"), Gateway: p.Gateway, Views: p.Views, MTU: 1420, HostSource: netip.MustParseAddr("10.0.1.1")}
	if !reflect.DeepEqual(w, want) {
		t.Errorf("worker's part:\n got %+v\nwant %+v", w, want)
	}
}

// A plan that follows the replicas' Lease moves its gateway to the
// holder's node once that node is one of the plan's with an address;
// each node's part then follows: the old gateway routes to the new one.
func TestPlanGatewayFollowsTheLease(t *testing.T) {
	p := testPlan()
	if _, ok := p.WithGatewayOf(ha.NewIdentity("w1")); ok {
		t.Error("a plan that follows no Lease moved its gateway")
	}
	p.GatewayLease = ha.LeaseName
	b, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParsePlan(b); err != nil || got.GatewayLease != ha.LeaseName {
		t.Fatalf("ParsePlan(%s) = %+v, %v; want the Lease kept", b, got, err)
	}
	moved, ok := p.WithGatewayOf(ha.NewIdentity("w1"))
	if !ok || moved.GatewayNode != "w1" || moved.Gateway != netip.MustParseAddr("198.18.0.3") {
		t.Fatalf("held by w1's replica: gateway %s at %s (moved %v), want w1 at 198.18.0.3", moved.GatewayNode, moved.Gateway, ok)
	}
	if d := moved.For("w1"); d.Role != fabric.Gateway {
		t.Errorf("the new gateway node's part has role %v", d.Role)
	}
	if d := moved.For("gw"); d.Role != fabric.Worker || d.Gateway != netip.MustParseAddr("198.18.0.3") {
		t.Errorf("the old gateway node's part: role %v via %s, want a worker via 198.18.0.3", d.Role, d.Gateway)
	}
	if p.GatewayNode != "gw" {
		t.Error("WithGatewayOf changed the plan it was called on")
	}
	for _, holder := range []string{
		"",                      // released
		ha.NewIdentity("gw"),    // the plan's own
		ha.NewIdentity("new"),   // a node without an address yet
		ha.NewIdentity("other"), // not in the plan
		"no-suffix",             // not a replica's identity
	} {
		if got, ok := p.WithGatewayOf(holder); ok || got.GatewayNode != "gw" {
			t.Errorf("held by %q: moved to %s, want the plan's gw", holder, got.GatewayNode)
		}
	}
}

// A CNI's own blocks are routed to their node by the gateway, and no
// host source is taken from them: their first address may be a pod's.
func TestPlanForNodeWithCNIBlocks(t *testing.T) {
	p := testPlan()
	blocks := []netip.Prefix{netip.MustParsePrefix("10.0.2.0/26"), netip.MustParsePrefix("10.0.2.64/26")}
	p.Nodes = append(p.Nodes, Node{Name: "calico", Addr: netip.MustParseAddr("198.18.0.4"), Blocks: blocks})
	b, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if p, err = ParsePlan(b); err != nil {
		t.Fatalf("ParsePlan(%s): %v", b, err)
	}
	gw := p.For("gw")
	if i := slices.IndexFunc(gw.Nodes, func(n fabric.Node) bool { return n.Addr == netip.MustParseAddr("198.18.0.4") }); i < 0 || !slices.Equal(gw.Nodes[i].PodCIDRs, blocks) {
		t.Errorf("gateway's nodes %+v: want 198.18.0.4 with %v", gw.Nodes, blocks)
	}
	if w := p.For("calico"); w.HostSource.IsValid() || w.Addr != netip.MustParseAddr("198.18.0.4") {
		t.Errorf("the node's part %+v: want its address and no host source", w)
	}
	// A plan without such blocks says nothing of them: fabric pods of
	// an earlier version read it.
	if b, _ := testPlan().Marshal(); strings.Contains(string(b), "blocks") {
		t.Errorf("plan without CNI blocks: %s", b)
	}
}

func TestParsePlanRefuses(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"gatewayNode":"gw","gateway":"198.18.0.2","tunnelInterface":"f0","views":[],"nodes":[],"extra":1}`, "unknown field"},
		{`{"gatewayNode":"","gateway":"198.18.0.2","tunnelInterface":"f0"}`, "no gateway node"},
		{`{"gatewayNode":"gw","gateway":"fd00::1","tunnelInterface":"f0"}`, "not an IPv4"},
		{`{"gatewayNode":"gw","tunnelInterface":"f0"}`, "not an IPv4"},
		{`{"gatewayNode":"gw","gateway":"198.18.0.2"}`, "no tunnel interface"},
		{`{"gatewayNode":"gw","gateway":"198.18.0.2","tunnelInterface":"f0","mtu":100}`, "MTU 100"},
		{`{"gatewayNode":"gw","gateway":"198.18.0.2","tunnelInterface":"f0","views":["10.0.0.1/16"]}`, "not canonical"},
		{`{"gatewayNode":"gw","gateway":"198.18.0.2","tunnelInterface":"f0","nodes":[{"name":"a","podCIDRs":["fd00::/64"]}]}`, "not IPv4"},
		{`{"gatewayNode":"gw","gateway":"198.18.0.2","tunnelInterface":"f0","nodes":[{"name":"a"},{"name":"a"}]}`, "listed twice"},
		{`{"gatewayNode":"gw","gateway":"198.18.0.2","tunnelInterface":"f0"} {}`, "trailing"},
	} {
		_, err := ParsePlan([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePlan(%s): %v, want an error with %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParsePlan(f *testing.F) {
	b, _ := testPlan().Marshal()
	f.Add(b)
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePlan(b)
		if err != nil {
			return
		}
		// What parses is valid and survives a round trip.
		out, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParsePlan(out); err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		if d := p.For(p.GatewayNode); d.Role != fabric.Gateway {
			t.Fatalf("the gateway node's part has role %q", d.Role)
		}
	})
}

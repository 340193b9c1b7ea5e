package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/tunnel"
)

// A restarted agent, or a replica taking over, applies the data path it
// restored before it publishes a plan: its first plan names the views the
// workers route to, where one without them would take the workers' routes
// to every peer away until the next.
func TestFabricPlanFirstPublishedWithViews(t *testing.T) {
	var published []fabricapi.Plan
	f := &fabricPlan{gatewayNode: "gw", publish: func(p fabricapi.Plan) { published = append(published, p) }}
	f.setNodes(func() []fabricapi.Node {
		return []fabricapi.Node{{Name: "gw", Addr: netip.MustParseAddr("198.18.0.2")}}
	}, 1420)
	view := func(as string) tunnel.Desired {
		return tunnel.Desired{Peers: []tunnel.Peer{{ClusterID: "b", Views: []tunnel.View{{Real: netip.MustParsePrefix("10.0.0.0/16"), As: netip.MustParsePrefix(as)}}}}}
	}
	f.setViews(view("10.70.0.0/16")) // the restored data path
	if len(published) != 0 {
		t.Fatalf("published before start: %+v", published)
	}
	f.start()
	if len(published) != 1 || !slices.Equal(published[0].Views, []netip.Prefix{netip.MustParsePrefix("10.70.0.0/16")}) {
		t.Fatalf("at start, published %+v, want one plan with the restored view", published)
	}
	if published[0].Gateway != netip.MustParseAddr("198.18.0.2") || published[0].MTU != 1420 {
		t.Errorf("first plan %+v, want the gateway node's address and the tunnel's MTU", published[0])
	}
	f.setViews(view("10.70.0.0/16"))
	f.setViews(view("10.71.0.0/16"))
	if len(published) != 2 || !slices.Equal(published[1].Views, []netip.Prefix{netip.MustParsePrefix("10.71.0.0/16")}) {
		t.Fatalf("after an unchanged and a changed data path, published %+v, want one more plan, with the new view", published)
	}
}

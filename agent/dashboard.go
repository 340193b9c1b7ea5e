package agent

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/observe/dashboard"
	"github.com/flotilla-io/flotilla/observe/graph"
	"github.com/flotilla-io/flotilla/peering/peerapi"
)

// dashboardHandler is the page at / on the metrics port. Until the Peers
// are watched it says the agent is starting; then it reads the Peer
// informer's cache and the agent's own tunnel counters, asking the API
// server nothing per page.
func (a *Agent) dashboardHandler() http.Handler {
	starting := dashboard.Starting(func() graph.Self { return graph.Self{Name: a.cfg.ClusterName, Nodes: -1} })
	return dashboard.New(func(ctx context.Context) (graph.Report, error) {
		if src := a.dashboard.Load(); src != nil {
			return (*src)(ctx)
		}
		return starting(ctx)
	}, a.log.With("component", "dashboard"))
}

// feedDashboard points the page at the Peer informer, once it synced,
// and at namespace offloading's cache (offloads; nil: none shown).
func (a *Agent) feedDashboard(clusterID string, objects *peerapi.Objects, offloads client.Reader) {
	nodes := a.nodes
	self := func() graph.Self {
		return graph.Self{ID: clusterID, Name: a.cfg.ClusterName, Nodes: nodes.count()}
	}
	src := dashboard.PeersSource(dashboard.Readers{Peers: objects.Reader(), Offloads: offloads, Metrics: a.registry}, self)
	a.dashboard.Store(&src)
}

// count is how many real Nodes the cluster has; -1 when they are not
// watched.
func (c clusterNodes) count() int {
	if c.store == nil {
		return -1
	}
	n := 0
	for _, obj := range c.store.List() {
		if node, ok := obj.(*corev1.Node); ok && !virtual(node) {
			n++
		}
	}
	return n
}

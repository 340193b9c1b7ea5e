package dashboard

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/observe/graph"
)

// PeersSource reports this cluster as self says, its Peers from reader
// (the agent's informer cache: no request to the API server per page),
// and the tunnel counters from metrics (the agent's registry; nil: none).
func PeersSource(reader client.Reader, self func() graph.Self, metrics prometheus.Gatherer) Source {
	return func(ctx context.Context) (graph.Report, error) {
		r := graph.Report{Self: self()}
		var peers v1alpha1.PeerList
		if err := reader.List(ctx, &peers); err != nil {
			return r, fmt.Errorf("list Peers: %w", err)
		}
		r.Peers = graph.PeersOf(peers.Items)
		if metrics == nil {
			return r, nil
		}
		// A collector that fails still leaves the others' families.
		fams, err := metrics.Gather()
		r.WithTraffic(graph.TrafficOf(fams))
		if err != nil {
			return r, fmt.Errorf("read the tunnel counters: %w", err)
		}
		return r, nil
	}
}

// Starting is the source of an agent whose Peers are not watched yet.
func Starting(self func() graph.Self) Source {
	return func(context.Context) (graph.Report, error) {
		return graph.Report{Self: self()}, errors.New("the agent is starting: its Peers are not read yet")
	}
}

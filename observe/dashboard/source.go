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

// Readers are where the page reads from: caches the agent keeps anyway,
// so that a page load asks the API server nothing.
type Readers struct {
	// Peers reads Peers (the Peer informer's cache); required.
	Peers client.Reader
	// Offloads reads NamespaceOffloads (namespace offloading's cache);
	// nil: none shown.
	Offloads client.Reader
	// Metrics has the tunnel counters (the agent's registry); nil: none.
	Metrics prometheus.Gatherer
}

// PeersSource reports this cluster as self says, with what the readers
// hold. What one of them cannot give is left out and named in the error.
func PeersSource(from Readers, self func() graph.Self) Source {
	return func(ctx context.Context) (graph.Report, error) {
		r := graph.Report{Self: self()}
		var peers v1alpha1.PeerList
		if err := from.Peers.List(ctx, &peers); err != nil {
			return r, fmt.Errorf("list Peers: %w", err)
		}
		r.Peers = graph.PeersOf(peers.Items)
		var errs []error
		if from.Offloads != nil {
			var offloads v1alpha1.NamespaceOffloadList
			if err := from.Offloads.List(ctx, &offloads); err != nil {
				errs = append(errs, fmt.Errorf("list NamespaceOffloads: %w", err))
			} else {
				r.Offloads = graph.OffloadsOf(offloads.Items)
			}
		}
		if from.Metrics != nil {
			// A collector that fails still leaves the others' families.
			fams, err := from.Metrics.Gather()
			r.WithTraffic(graph.TrafficOf(fams))
			if err != nil {
				errs = append(errs, fmt.Errorf("read the tunnel counters: %w", err))
			}
		}
		return r, errors.Join(errs...)
	}
}

// Starting is the source of an agent whose Peers are not watched yet.
func Starting(self func() graph.Self) Source {
	return func(context.Context) (graph.Report, error) {
		return graph.Report{Self: self()}, errors.New("the agent is starting: its Peers are not read yet")
	}
}

package agent

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/flotilla-io/flotilla/peering/peerapi"
)

// warmStandby is what a standby replica (--leader-elect) keeps ready
// while it waits for the Lease, so that its takeover does not wait for
// it: the informers the network path reads before traffic flows again,
// of the Peers (the engine hears every Peer's spec before the join) and
// of the Nodes (the local networks and the fabric plan). They are
// started and listed as a standby and run on once it is active; what
// they add to a standby is the objects they hold.
//
// The clusterset DNS server runs on the standby whole, answering on its
// own node's address: it reads the API server and writes nothing, so at
// takeover it answers at once instead of failing until its informers
// have listed. Its Service selects the active replica only.
//
// Everything else waits for the Lease: the data path (a standby has
// none), the ledger (it follows the active replica's snapshots, and is
// opened by the active replica only), gossip (the cluster's identity is
// one member; a second would contradict the first), the CoreDNS
// forwarding block (a write) and offloading's other informers, which
// list much more and are not on the network path.
type warmStandby struct {
	peers *peerapi.Objects
	nodes toolscache.SharedIndexInformer
	// dns: the clusterset DNS server runs (a known node address and a
	// --clusterset-dns-port).
	dns bool
}

// startWarm makes the standby's informers (a.warm) and starts them as
// components; it logs once both have listed.
func (a *Agent) startWarm(ctx context.Context, comps *components) error {
	peers, err := a.newPeerObjects()
	if err != nil {
		return err
	}
	nodes, err := a.newNodeInformer()
	if err != nil {
		return err
	}
	a.warm = &warmStandby{peers: peers, nodes: nodes}
	// The node's address is known only from $POD_IP (or the flag) this
	// early; without it, the DNS waits for the start to learn it.
	if a.cfg.ClustersetDNSPort != 0 && a.cfg.NodeAddress.IsValid() {
		if err := a.serveClustersetDNS(comps); err != nil {
			return err
		}
		a.warm.dns = true
	}
	start := time.Now()
	comps.Go("Peer informer", peers.RunCache)
	comps.Go("Node informer", func(ctx context.Context) error {
		nodes.RunWithContext(ctx) // returns once its goroutines have ended
		return nil
	})
	go func() {
		listed := func(ctx context.Context) (bool, error) { return peers.HasSynced(ctx) && nodes.HasSynced(), nil }
		if wait.PollUntilContextCancel(ctx, warmPoll, true, listed) == nil {
			a.log.Info("standby warm: Peers and Nodes listed", "took", time.Since(start).Round(time.Millisecond))
		}
	}()
	return nil
}

// warmPoll is how often the standby looks whether its informers listed.
const warmPoll = 20 * time.Millisecond

// peerObjects is the standby's Peer informer, or nil: none warmed.
func (w *warmStandby) peerObjects() *peerapi.Objects {
	if w == nil {
		return nil
	}
	return w.peers
}

// nodeInformer is the standby's Node informer, or nil: none warmed.
func (w *warmStandby) nodeInformer() toolscache.SharedIndexInformer {
	if w == nil {
		return nil
	}
	return w.nodes
}

// answersDNS reports whether the standby's clusterset DNS server runs.
func (w *warmStandby) answersDNS() bool { return w != nil && w.dns }

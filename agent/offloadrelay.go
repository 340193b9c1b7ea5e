package agent

import (
	"crypto/ed25519"
	"sync"

	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
)

// offloadRelay is the engine's Publisher and GrantReceiver. Offloading is
// made after the gossip join (startComponents), so nothing it builds holds
// up the network path; until then the relay writes peer states to the
// Peer writer alone and keeps the newest state and grant of each peer,
// which attach hands over, as if offloading had run from the start.
type offloadRelay struct {
	// objects is the Peer writer; writer is objects, or a test's.
	objects *peerapi.Objects
	writer  peering.Publisher

	// mu is held while offloading is told, so a state replayed by attach
	// never overtakes a newer one from the engine.
	mu     sync.Mutex
	off    relayed
	states map[string]peering.PeerState
	grants map[string]receivedGrant
}

// relayed is what offloading takes from the engine.
type relayed interface {
	peerChanged(s peering.PeerState)
	peering.GrantReceiver
}

type receivedGrant struct {
	key    ed25519.PublicKey
	sealed []byte
}

func newOffloadRelay(objects *peerapi.Objects, writer peering.Publisher) *offloadRelay {
	return &offloadRelay{objects: objects, writer: writer, states: map[string]peering.PeerState{}, grants: map[string]receivedGrant{}}
}

// attach hands offloading what the engine said before it was made, then
// everything as it comes.
func (r *offloadRelay) attach(off relayed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.off = off
	for _, s := range r.states {
		off.peerChanged(s)
	}
	for from, g := range r.grants {
		off.GrantReceived(from, g.key, g.sealed)
	}
	r.states, r.grants = nil, nil
}

// Publish writes the state to the Peer object and tells offloading.
func (r *offloadRelay) Publish(s peering.PeerState) {
	r.writer.Publish(s)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.off == nil {
		r.states[s.ClusterID] = s
		return
	}
	r.off.peerChanged(s)
}

// Withdraw is the Peer writer's (peering.Publisher).
func (r *offloadRelay) Withdraw(id string) { r.writer.Withdraw(id) }

// Retire is the Peer writer's (peering.Publisher).
func (r *offloadRelay) Retire(id, why string) { r.writer.Retire(id, why) }

// GrantReceived hands a provider's grant to the consumer's credentials
// (peering.GrantReceiver), or keeps the newest until they are made.
func (r *offloadRelay) GrantReceived(from string, key ed25519.PublicKey, sealed []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.off == nil {
		r.grants[from] = receivedGrant{key: key, sealed: sealed}
		return
	}
	r.off.GrantReceived(from, key, sealed)
}

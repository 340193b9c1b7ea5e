package tunnel

import (
	"bytes"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// First contact: one side initiates.
//
// Two gateways that peer add each other within milliseconds (both act on
// the same exchange of statements). A peer added with a persistent
// keepalive sends a keepalive at once, and so a handshake initiation: both
// sides initiate together. Each then receives the other's initiation and,
// nearly at once, the response to its own. wireguard-go hands the two
// messages to different handshake workers, and consuming the response
// does not re-check the handshake state after the initiation changed it,
// so one side can derive keys the other does not have: both report a
// handshake, yet one direction carries nothing until WireGuard gives up on
// the session about 15 s later. In 300 simultaneous first contacts of two
// wireguard-go devices (up to 5 ms apart, go run ./hack/wgrace) 2% lost a
// direction for 14 s and one in ten took 5 s to the first handshake
// (crossed initiations both refused); with one side initiating, none did.
//
// So, for a new peer, the side with the larger public key waits: it adds
// the peer without its keepalive, which would initiate. The other side's
// keepalive then brings the handshake, after which the waiting side turns
// its keepalive on. The other side's initiation may have come before this
// side knew the peer, and been dropped (its retry is 5 s away); then this
// side initiates itself, once it knows that the other side's went out:
// the peer says when its data path holds this side (Peer.FirstContact,
// from its peering statement). Guessing instead, after a fixed wait, loses
// to load: on 2 busy cores the other side sometimes added the peer just
// after a 100 ms guess, and both initiated (a 5 s stall in 1 of 5 starts
// of 5 agents). A peer that says nothing (an older agent) still gets the
// guess: FirstContactWait. If something arrived but no session followed,
// the waiting side initiates after firstContactLimit.
const (
	DefaultFirstContactWait = 100 * time.Millisecond
	firstContactLimit       = 10 * time.Second
	// firstContactPoll is how often a waiting first contact is looked at.
	// A peer that says its data path holds us is given one look, so that
	// its initiation, sent before it said so, is not crossed in flight.
	firstContactPoll = 20 * time.Millisecond
)

// waitsFor reports whether this side, with public key mine, waits for a
// new peer with public key theirs to initiate.
func waitsFor(mine, theirs Key) bool { return bytes.Compare(mine[:], theirs[:]) > 0 }

// holdFirstContact notes that peer p is being added to the device, and
// holds back its keepalive if this side is the one that waits.
func (t *Tunnel) holdFirstContact(p Peer, now time.Time) {
	if p.Keepalive <= 0 || p.Initiates {
		return // nothing would initiate, or only this side can
	}
	if _, ok := t.waiting[p.PublicKey]; ok {
		return
	}
	if waitsFor(t.pub, p.PublicKey) {
		t.waiting[p.PublicKey] = now
	}
}

// effective is p as configured on the device now: without its keepalive
// while its first contact waits.
func (t *Tunnel) effective(p Peer) Peer {
	if _, ok := t.waiting[p.PublicKey]; ok {
		p.Keepalive = 0
	}
	return p
}

// settleFirstContacts ends the waits that are over, given the device as
// read, and reports whether any ended. Called with mu held.
func (t *Tunnel) settleFirstContacts(dev *wgtypes.Device, now time.Time) bool {
	if len(t.waiting) == 0 {
		return false
	}
	settled := false
	for _, p := range dev.Peers {
		k := Key(p.PublicKey)
		since, ok := t.waiting[k]
		if !ok {
			continue
		}
		outcome := ""
		contact := t.contacts[k]
		switch waited := now.Sub(since); {
		case p.LastHandshakeTime.Unix() > 0:
			outcome = "answered"
		case p.ReceiveBytes == 0 && contact == FirstContactReady:
			outcome = "initiated"
		case p.ReceiveBytes == 0 && contact == FirstContactGuess && waited >= t.cfg.FirstContactWait:
			outcome = "initiated"
		case waited >= firstContactLimit:
			outcome = "timed out"
		}
		if outcome != "" {
			delete(t.waiting, k)
			t.metrics.firstContacts.WithLabelValues(outcome).Inc()
			t.log.Debug("first contact settled", "peer", t.peerIDs[k], "outcome", outcome, "peerSays", contact, "waited", now.Sub(since))
			settled = true
		}
	}
	return settled
}

// forgetFirstContacts drops the waits of peers no longer desired.
func (t *Tunnel) forgetFirstContacts(desired map[Key]Peer) {
	for k := range t.waiting {
		if _, ok := desired[k]; !ok {
			delete(t.waiting, k)
		}
	}
}

// scheduleFirstContacts makes sure waiting first contacts are looked at
// again soon. Called with mu held.
func (t *Tunnel) scheduleFirstContacts() {
	if len(t.waiting) == 0 || t.contactTimer != nil || t.closed {
		return
	}
	t.contactTimer = time.AfterFunc(firstContactPoll, t.checkFirstContacts)
}

// checkFirstContacts reads the device and reconfigures the peers whose
// wait is over.
func (t *Tunnel) checkFirstContacts() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.contactTimer = nil
	if t.closed || t.desired == nil || len(t.waiting) == 0 {
		return
	}
	dev, err := t.wg.Device(t.cfg.Interface)
	if err != nil {
		t.log.Debug("first contact: read device", "err", err)
	} else if t.settleFirstContacts(dev, time.Now()) {
		if _, err := t.configurePeers(*t.desired, false); err != nil {
			t.log.Warn("first contact: turn the keepalive on", "err", err)
		}
	}
	t.scheduleFirstContacts()
}

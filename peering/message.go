// Package peering turns federation members into connected peers: each pair
// exchanges signed statements (networks, WireGuard key, endpoint, whether it
// accepts networking, and how it sees the other's networks), records the
// views in the ledger, drives the tunnel, and emits plain peer state. It
// knows nothing of Kubernetes: peering/peerapi turns that state into Peer
// objects and their specs into Spec.
package peering

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/flotilla-io/flotilla/ipam"
	"net/netip"
	"slices"

	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/peering/protocol"
)

// Protocol versions: the range package protocol defines, under the names
// the negotiation uses.
const (
	ProtocolVersion    = protocol.Current
	ProtocolVersionMin = protocol.Min
	ProtocolVersionMax = protocol.Max
)

// protocolTunnelReady is the first version whose writers say tunnelReady:
// from an older peer, its absence says nothing.
const protocolTunnelReady = 3

// signingDomain is signed before the payload, so that a signature over a
// peering statement can never pass for one over anything else a cluster
// signs (member records sign their own domain). It names the signing
// scheme, not the protocol version: every version in range shares it.
const signingDomain = "flotilla.io/peering/v1 statement\x00"

// Decision is one side's choice about networking with the other.
type Decision string

const (
	// Accept: this side wants the tunnel.
	Accept Decision = "accept"
	// Pending: this side waits for its admin (--peering=manual).
	Pending Decision = "pending"
	// Deny: this side refuses; the other must tear down.
	Deny Decision = "deny"
)

// ViewClaim says how the sender addresses a range of the receiver: the
// receiver's range Range is As for the sender.
type ViewClaim struct {
	Range netip.Prefix `json:"range"`
	As    netip.Prefix `json:"as"`
}

// Hello is what one cluster tells another about itself and about how it
// sees the other. It is signed by the sender's identity key. Its content
// changes only when the sender's statement, decision or views change, so
// an exchange settles after a few messages.
type Hello struct {
	// Protocol is the version the Hello is written in.
	Protocol uint16 `json:"protocol"`
	// ProtocolMin and ProtocolMax are the versions the sender reads, so a
	// newer receiver can answer in one of them. They are advice: nothing
	// is refused for what they say.
	ProtocolMin uint16 `json:"protocolMin"`
	ProtocolMax uint16 `json:"protocolMax"`
	From        string `json:"from"`
	To          string `json:"to"`
	// Generation grows with every new Hello a cluster issues (to anyone); a
	// receiver refuses one older than the newest it accepted from the
	// sender, and a different one of the same generation.
	Generation uint64 `json:"generation"`
	// Name is the sender's human name.
	Name string `json:"name,omitempty"`
	// Networks are the sender's real ranges (pods and other routed ranges).
	Networks []netip.Prefix `json:"networks"`
	// WireGuardKey is the sender's WireGuard public key (32 bytes).
	WireGuardKey []byte `json:"wireguardKey"`
	// Endpoint is the sender's WireGuard UDP endpoint.
	Endpoint netip.AddrPort `json:"endpoint"`
	Decision Decision       `json:"decision"`
	// ViewsOfYou are the sender's views of the receiver's Networks; empty
	// until the sender accepts and knows them.
	ViewsOfYou []ViewClaim `json:"viewsOfYou,omitempty"`
	// TunnelReady says the sender's data path holds the receiver: if the
	// sender is the side that starts the first WireGuard handshake, it has
	// started it, so a receiver that waits for it and saw nothing knows it
	// was lost (tunnel's first contact). Since version 3.
	TunnelReady bool `json:"tunnelReady,omitempty"`
	// Grant is the sender's grant to the receiver, sealed to the receiver
	// (offload/grant); peering carries it unopened. Empty says nothing
	// new: a revocation is a grant too. Since version 4.
	Grant []byte `json:"grant,omitempty"`
	// Labels are the sender's cluster labels (--cluster-label), which the
	// receiver shows on its Peer for the sender: Kubernetes label keys
	// and values, none under flotilla.io/ (CheckLabels). Since version 4.
	Labels map[string]string `json:"labels,omitempty"`
}

// Limits on what a Hello may carry, so a hostile sender cannot make us
// allocate much or program absurd state.
const (
	maxMessageSize = 64 << 10
	maxNameLength  = 253
	signatureSize  = ed25519.SignatureSize
)

// MaxGrantSize bounds the sealed grant a Hello carries: with MaxNetworks
// networks and views of them it fits in a message.
const MaxGrantSize = 40 << 10

// MaxNetworks is how many networks (and views of them) a Hello carries at
// most; an agent with more pod blocks announces its ranges instead.
const MaxNetworks = 64

var magic = [4]byte{'F', 'L', 'P', 1}

// Errors a received Hello is refused with. They label the refused-messages
// metric.
var (
	ErrMalformed    = errors.New("malformed message")
	ErrIncompatible = errors.New("incompatible protocol version")
	ErrForged       = errors.New("signature does not verify")
	ErrReplayed     = errors.New("replayed or stale message")
	ErrMisdirected  = errors.New("message addressed to another cluster")
)

// Seal signs h with id and encodes it: magic, payload length, JSON payload,
// Ed25519 signature over the signing domain followed by the payload.
// It writes h in this agent's protocol version, whatever h.Protocol says.
func Seal(h *Hello, id identity.Identity) ([]byte, error) {
	w := *h
	h = &w
	h.Protocol, h.ProtocolMin, h.ProtocolMax = ProtocolVersion, ProtocolVersionMin, ProtocolVersionMax
	if h.From != id.ClusterID() {
		return nil, fmt.Errorf("seal hello: from %s, but the identity is %s", h.From, id.ClusterID())
	}
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("seal hello to %s: %w", h.To, err)
	}
	payload, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("seal hello to %s: %w", h.To, err)
	}
	if len(payload)+len(magic)+4+signatureSize > maxMessageSize {
		return nil, fmt.Errorf("seal hello to %s: %d bytes, over the %d limit", h.To, len(payload), maxMessageSize)
	}
	out := make([]byte, 0, len(magic)+4+len(payload)+signatureSize)
	out = append(out, magic[:]...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(payload)))
	out = append(out, payload...)
	return append(out, id.Sign(signed(payload))...), nil
}

// signed is what a signature covers: the domain, then the payload.
func signed(payload []byte) []byte {
	return append([]byte(signingDomain), payload...)
}

// Sealed is a received message split into its parts; Verify checks it.
type Sealed struct {
	Hello     Hello
	payload   []byte
	signature []byte
}

// Parse decodes a message without verifying its signature: the signer's
// key comes from the membership, looked up by Hello.From.
func Parse(b []byte) (*Sealed, error) {
	if len(b) > maxMessageSize {
		return nil, fmt.Errorf("%w: %d bytes, over the %d limit", ErrMalformed, len(b), maxMessageSize)
	}
	if len(b) < len(magic)+4+signatureSize || !bytes.Equal(b[:len(magic)], magic[:]) {
		return nil, fmt.Errorf("%w: not a flotilla peering message", ErrMalformed)
	}
	n := binary.BigEndian.Uint32(b[len(magic):])
	rest := b[len(magic)+4:]
	if uint64(n)+signatureSize != uint64(len(rest)) {
		return nil, fmt.Errorf("%w: payload length %d does not match the message", ErrMalformed, n)
	}
	s := &Sealed{payload: rest[:n], signature: rest[n:]}
	var probe struct {
		Protocol uint16 `json:"protocol"`
	}
	if err := json.Unmarshal(s.payload, &probe); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := readable(probe.Protocol); err != nil {
		return nil, err
	}
	// Unknown fields are what newer versions within range add: ignored.
	if err := json.Unmarshal(s.payload, &s.Hello); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := s.Hello.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return s, nil
}

// Verify checks the signature against the sender's identity key, which
// must be the key of the cluster ID the Hello claims to come from.
func (s *Sealed) Verify(pub ed25519.PublicKey) error {
	if err := identity.Verify(s.Hello.From, pub, signed(s.payload), s.signature); err != nil {
		return fmt.Errorf("%w: %v", ErrForged, err)
	}
	return nil
}

// SameAs reports whether two messages carry the same signed payload.
func (s *Sealed) SameAs(payload []byte) bool { return bytes.Equal(s.payload, payload) }

// Payload returns the signed bytes.
func (s *Sealed) Payload() []byte { return s.payload }

// readable checks that this agent reads version v.
func readable(v uint16) error {
	switch {
	case v < ProtocolVersionMin:
		return fmt.Errorf("%w: the sender writes version %d, this agent reads %d to %d: upgrade the sender's agent", ErrIncompatible, v, ProtocolVersionMin, ProtocolVersionMax)
	case v > ProtocolVersionMax:
		return fmt.Errorf("%w: the sender writes version %d, this agent reads %d to %d: upgrade this agent", ErrIncompatible, v, ProtocolVersionMin, ProtocolVersionMax)
	}
	return nil
}

func (h *Hello) validate() error {
	if err := readable(h.Protocol); err != nil {
		return err
	}
	if err := identity.ValidateClusterID(h.From); err != nil {
		return fmt.Errorf("from: %w", err)
	}
	if err := identity.ValidateClusterID(h.To); err != nil {
		return fmt.Errorf("to: %w", err)
	}
	if h.From == h.To {
		return errors.New("from and to are the same cluster")
	}
	if h.Generation == 0 {
		return errors.New("generation 0")
	}
	if len(h.Name) > maxNameLength {
		return fmt.Errorf("name of %d bytes, over %d", len(h.Name), maxNameLength)
	}
	switch h.Decision {
	case Accept, Pending, Deny:
	default:
		return fmt.Errorf("decision %q: want accept, pending or deny", h.Decision)
	}
	if len(h.Networks) > MaxNetworks || len(h.ViewsOfYou) > MaxNetworks {
		return fmt.Errorf("more than %d networks", MaxNetworks)
	}
	if len(h.Grant) > MaxGrantSize {
		return fmt.Errorf("grant of %d bytes, over %d", len(h.Grant), MaxGrantSize)
	}
	if err := CheckLabels(h.Labels); err != nil {
		return err
	}
	if len(h.WireGuardKey) != 32 {
		return fmt.Errorf("WireGuard key of %d bytes, want 32", len(h.WireGuardKey))
	}
	if !h.Endpoint.IsValid() || h.Endpoint.Port() == 0 || h.Endpoint.Addr().IsUnspecified() {
		return fmt.Errorf("endpoint %q: want address:port", h.Endpoint)
	}
	for i, n := range h.Networks {
		if err := ipam.CheckRange(n); err != nil {
			return fmt.Errorf("network %s: %w", n, err)
		}
		if err := CheckNetwork(n); err != nil {
			return fmt.Errorf("network %s: %w", n, err)
		}
		for _, m := range h.Networks[:i] {
			if m.Overlaps(n) {
				return fmt.Errorf("networks %s and %s overlap", m, n)
			}
		}
	}
	if h.Decision != Accept && len(h.ViewsOfYou) > 0 {
		return fmt.Errorf("views offered with decision %s", h.Decision)
	}
	for i, v := range h.ViewsOfYou {
		if err := ipam.CheckRange(v.Range); err != nil {
			return fmt.Errorf("view of %s: %w", v.Range, err)
		}
		if err := ipam.CheckRange(v.As); err != nil {
			return fmt.Errorf("view %s as %s: %w", v.Range, v.As, err)
		}
		if err := CheckNetwork(v.As); err != nil {
			return fmt.Errorf("view %s as %s: %w", v.Range, v.As, err)
		}
		if v.Range.Bits() != v.As.Bits() || v.Range.Addr().Is4() != v.As.Addr().Is4() {
			return fmt.Errorf("view %s as %s: not the same size and family", v.Range, v.As)
		}
		if slices.ContainsFunc(h.ViewsOfYou[:i], func(w ViewClaim) bool { return w.Range.Overlaps(v.Range) || w.As.Overlaps(v.As) }) {
			return fmt.Errorf("views of %s overlap another view", v.Range)
		}
	}
	return nil
}

// Pod networks live in private (RFC 1918) or shared (RFC 6598) address
// space. A peer may announce nothing else, and nothing wider than /8: a
// public range would pull this gateway's internet traffic for it into
// one peer's tunnel.
var private = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
}

// CheckNetwork checks that p is a range the protocol can carry: IPv4 (the tunnel
// routes IPv4 only) inside private or shared address space.
func CheckNetwork(p netip.Prefix) error {
	if !p.Addr().Is4() {
		return errors.New("IPv6 is not carried by this protocol version")
	}
	for _, r := range private {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return nil
		}
	}
	return errors.New("not inside private (10/8, 172.16/12, 192.168/16) or shared (100.64/10) address space")
}

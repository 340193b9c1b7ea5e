package tunnel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/policy"
	"net/netip"
	"slices"
	"time"
	"unicode"
)

// View is how one cluster addresses a network of another: Real is the
// network as its owner numbers it, As is the range the viewer uses for it.
// Both have the same length; where nothing overlaps, As equals Real.
type View struct {
	Real netip.Prefix `json:"real"`
	As   netip.Prefix `json:"as"`
}

// Peer is one remote cluster as this agent wants the tunnel to it.
type Peer struct {
	// ClusterID names the peer in logs, metrics, routes and NAT rules.
	ClusterID string `json:"clusterID"`
	// PublicKey is the peer's WireGuard public key.
	PublicKey Key `json:"publicKey"`
	// Endpoint is the peer gateway's UDP address; zero means wait for the
	// peer to dial us.
	Endpoint netip.AddrPort `json:"endpoint"`
	// Keepalive is WireGuard's persistent keepalive; zero turns it off.
	Keepalive time.Duration `json:"keepalive,omitempty"`
	// Views are my views of the peer's networks (Real: theirs, As: how I
	// address them). They become allowed IPs and routes.
	Views []View `json:"views"`
	// ViewsOfMe are the peer's views of my networks (Real: mine, As: how
	// the peer addresses them). They drive the prefix NAT.
	ViewsOfMe []View `json:"viewsOfMe"`
	// FirstContact is what the peer says of its side of a new peering;
	// it decides when a side that waits for the first handshake stops
	// waiting (firstcontact.go).
	FirstContact FirstContact `json:"firstContact,omitempty"`
	// Initiates: the peer cannot reach this side first (this gateway is
	// behind NAT), so this side never waits for its first handshake.
	Initiates bool `json:"initiates,omitempty"`
	// Segregated, when set, is all that traffic from the peer may reach
	// in this cluster (filter.go); nil is Full: everything, as routed.
	// Its Peer field is ignored: the set belongs to this peer.
	Segregated *policy.Sets `json:"segregated,omitempty"`
}

// FirstContact is what the peer says of its side of the first handshake.
type FirstContact string

const (
	// FirstContactGuess: the peer says nothing (an older agent). A side
	// that waits initiates itself when nothing came within
	// FirstContactWait.
	FirstContactGuess FirstContact = ""
	// FirstContactAnnounced: the peer says when its data path holds this
	// side, and has not yet. A side that waits keeps waiting.
	FirstContactAnnounced FirstContact = "announced"
	// FirstContactReady: the peer's data path holds this side, so it has
	// initiated if it is the side that does. A side that waits and saw
	// nothing initiates: the peer's initiation came before it knew the
	// peer, and was dropped.
	FirstContactReady FirstContact = "ready"
)

// Desired is everything the tunnel should make exist on this host.
type Desired struct {
	// Networks are this cluster's real networks (PodCIDR and the like).
	Networks []netip.Prefix `json:"networks"`
	Peers    []Peer         `json:"peers"`
	// HostSource is the source of traffic this host originates to a view
	// (the gateway host itself, hostNetwork pods): an IPv4 address inside
	// one of Networks, so that the prefix NAT gives it the peer's view of
	// it and the peer's allowed IPs accept it. The agent sets it to the
	// first address of the gateway node's own pod block, which bridge,
	// flannel and Cilium give the host side. The tunnel holds it as a /32
	// on its link and as the preferred source of every route of a view.
	// Zero: routes without a source; such traffic leaves with the host's
	// node address and the peer refuses it.
	HostSource netip.Addr `json:"hostSource,omitzero"`
}

// maxClusterIDLen bounds cluster IDs; they end up in rule comments (at most
// 128 bytes of user data in the kernel) and metric labels.
const maxClusterIDLen = 64

// ParseDesired decodes a desired state from JSON and validates it.
func ParseDesired(b []byte) (Desired, error) {
	var d Desired
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Desired{}, fmt.Errorf("decode desired tunnel state: %w", err)
	}
	if dec.More() {
		return Desired{}, fmt.Errorf("decode desired tunnel state: trailing data")
	}
	if err := d.Validate(); err != nil {
		return Desired{}, err
	}
	return d, nil
}

// Validate checks that d can be made to exist without ambiguity: every
// range is IPv4 and canonical, a view keeps its network's length, my views
// of all peers are disjoint from each other and from my own networks, and
// peers are unique by cluster ID and key.
func (d Desired) Validate() error {
	for i, n := range d.Networks {
		if err := checkPrefix(n); err != nil {
			return fmt.Errorf("local network %s: %w", n, err)
		}
		for _, m := range d.Networks[:i] {
			if n.Overlaps(m) {
				return fmt.Errorf("local networks %s and %s overlap", m, n)
			}
		}
	}
	if err := d.checkHostSource(); err != nil {
		return err
	}
	ids := map[string]bool{}
	keys := map[Key]string{}
	// claimed holds every range this host routes: my networks and my views.
	var claimed []claim
	for _, n := range d.Networks {
		claimed = append(claimed, claim{p: n})
	}
	for _, p := range d.Peers {
		if err := checkClusterID(p.ClusterID); err != nil {
			return err
		}
		if ids[p.ClusterID] {
			return fmt.Errorf("peer %s: listed twice", p.ClusterID)
		}
		ids[p.ClusterID] = true
		if p.PublicKey.IsZero() {
			return fmt.Errorf("peer %s: no public key", p.ClusterID)
		}
		if other, dup := keys[p.PublicKey]; dup {
			return fmt.Errorf("peer %s: public key already used by peer %s", p.ClusterID, other)
		}
		keys[p.PublicKey] = p.ClusterID
		if p.Endpoint.IsValid() && p.Endpoint.Port() == 0 {
			return fmt.Errorf("peer %s: endpoint %s has no port", p.ClusterID, p.Endpoint)
		}
		if p.Keepalive < 0 || p.Keepalive > 65535*time.Second {
			return fmt.Errorf("peer %s: keepalive %s out of range 0..65535s", p.ClusterID, p.Keepalive)
		}
		switch p.FirstContact {
		case FirstContactGuess, FirstContactAnnounced, FirstContactReady:
		default:
			return fmt.Errorf("peer %s: first contact %q: want %q, %q or empty", p.ClusterID, p.FirstContact, FirstContactAnnounced, FirstContactReady)
		}
		if p.Segregated != nil {
			if err := p.Segregated.Check(); err != nil {
				return fmt.Errorf("peer %s: segregated traffic: %w", p.ClusterID, err)
			}
		}
		if len(p.Views) == 0 {
			return fmt.Errorf("peer %s: no views of its networks", p.ClusterID)
		}
		for i, v := range p.Views {
			if err := checkView(v); err != nil {
				return fmt.Errorf("peer %s: view %s as %s: %w", p.ClusterID, v.Real, v.As, err)
			}
			for _, w := range p.Views[:i] {
				if v.Real.Overlaps(w.Real) {
					return fmt.Errorf("peer %s: its networks %s and %s overlap", p.ClusterID, w.Real, v.Real)
				}
			}
			claimed = append(claimed, claim{p: v.As, peer: p.ClusterID})
		}
		for i, v := range p.ViewsOfMe {
			if err := checkView(v); err != nil {
				return fmt.Errorf("peer %s: its view of %s as %s: %w", p.ClusterID, v.Real, v.As, err)
			}
			if !containsPrefix(d.Networks, v.Real) {
				return fmt.Errorf("peer %s: its view of %s: not one of my networks %v", p.ClusterID, v.Real, d.Networks)
			}
			for _, w := range p.ViewsOfMe[:i] {
				if v.Real == w.Real {
					return fmt.Errorf("peer %s: two views of my network %s", p.ClusterID, v.Real)
				}
				if v.As.Overlaps(w.As) {
					return fmt.Errorf("peer %s: its views %s and %s of my networks overlap", p.ClusterID, w.As, v.As)
				}
			}
		}
	}
	return checkDisjoint(claimed)
}

// checkHostSource: zero, or an IPv4 address inside one of my networks,
// neither its first nor its last address.
func (d Desired) checkHostSource() error {
	a := d.HostSource
	if !a.IsValid() {
		return nil
	}
	if !a.Is4() {
		return fmt.Errorf("host source %s: only IPv4 is supported", a)
	}
	for _, n := range d.Networks {
		if !n.Contains(a) {
			continue
		}
		if a == n.Addr() || a == lastAddr(n) {
			return fmt.Errorf("host source %s: the first or last address of %s; use a host address, such as the first address of this node's pod block", a, n)
		}
		return nil
	}
	return fmt.Errorf("host source %s: not inside any of my networks %v, so no view of it exists; use the first address of this node's pod block", a, d.Networks)
}

// claim is a range this host routes: a local network (no peer) or my view
// of a network of peer.
type claim struct {
	p    netip.Prefix
	peer string
}

func (c claim) String() string {
	if c.peer == "" {
		return "local network " + c.p.String()
	}
	return "view " + c.p.String() + " of peer " + c.peer
}

// checkDisjoint reports two of the claims that overlap, if any. Sorted by
// first address, prefixes overlap only if one starts before the furthest
// end seen so far; n log n, so that 1000 peers validate in well under a
// millisecond.
func checkDisjoint(claims []claim) error {
	slices.SortFunc(claims, func(a, b claim) int { return comparePrefix(a.p, b.p) })
	var widest *claim
	for i := range claims {
		c := &claims[i]
		if widest != nil && widest.p.Overlaps(c.p) {
			a, b := *widest, *c
			if b.peer == "" {
				a, b = b, a // name the view, not the local network, first
			}
			return fmt.Errorf("peer %s: %s overlaps %s", b.peer, b, a)
		}
		if widest == nil || lastAddr(c.p).Compare(lastAddr(widest.p)) > 0 {
			widest = c
		}
	}
	return nil
}

// checkPrefix is the ledger's range check, IPv4 only: the tunnel routes
// IPv4.
func checkPrefix(p netip.Prefix) error {
	if err := ipam.CheckRange(p); err != nil {
		return err
	}
	if !p.Addr().Is4() {
		return fmt.Errorf("%s: only IPv4 is supported", p)
	}
	return nil
}

func checkView(v View) error {
	if err := checkPrefix(v.Real); err != nil {
		return err
	}
	if err := checkPrefix(v.As); err != nil {
		return err
	}
	if v.Real.Bits() != v.As.Bits() {
		return fmt.Errorf("lengths differ (/%d and /%d)", v.Real.Bits(), v.As.Bits())
	}
	return nil
}

func checkClusterID(id string) error {
	if id == "" {
		return fmt.Errorf("peer with no cluster ID")
	}
	if len(id) > maxClusterIDLen {
		return fmt.Errorf("peer %.16s...: cluster ID longer than %d bytes", id, maxClusterIDLen)
	}
	for _, r := range id {
		if r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("peer %q: cluster ID may hold only ASCII letters, digits, '-', '_' and '.'", id)
		}
	}
	return nil
}

func containsPrefix(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// Package policy decides what traffic a peer may send into this cluster
// when the peer is Segregated: its own pods offloaded here, and the
// endpoints of the Services reflected or exported to it on those Services'
// ports. It knows nothing of Kubernetes or nftables: the agent feeds it
// plain state, and the tunnel turns its answer into kernel sets.
package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"unicode"
)

// Mode is how much of this cluster a peer reaches.
type Mode string

const (
	// Full: every pod of this cluster, as before segregation existed.
	Full Mode = "Full"
	// Segregated: only what was offloaded or exported to the peer.
	Segregated Mode = "Segregated"
)

// ParseMode accepts the two modes by name; empty means Full, the default
// that keeps today's behaviour.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", Full:
		return Full, nil
	case Segregated:
		return Segregated, nil
	}
	return "", fmt.Errorf("traffic mode %q: want %q or %q", s, Full, Segregated)
}

// Protocol is an IP protocol number a Service port can carry.
type Protocol uint8

const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// Port is one port of a Service as its endpoints listen on it (the target
// port: the peer's proxy has already translated the Service port).
type Port struct {
	Protocol Protocol
	Port     uint16
}

// Service is a Service reflected or exported to a peer, shaped like an
// EndpointSlice: every address serves every port.
type Service struct {
	// Name says which Service this is in errors ("namespace/name").
	Name string
	// Addresses are the endpoints' addresses in this cluster's terms: our
	// real pod IPs, or our view of a third cluster's pod IPs.
	Addresses []netip.Addr
	Ports     []Port
}

// Peer is what this cluster has given one peer.
type Peer struct {
	ID   string
	Mode Mode
	// Pods are the addresses of the peer's pods offloaded here, as this
	// cluster numbers them (our real pod IPs). Traffic from the peer is
	// filtered after the tunnel's DNAT, so these are the destinations the
	// filter sees.
	Pods     []netip.Addr
	Services []Service
}

// Endpoint is one element of a services set: a destination address, its
// protocol and port.
type Endpoint struct {
	Addr     netip.Addr `json:"addr"`
	Protocol Protocol   `json:"protocol"`
	Port     uint16     `json:"port"`
}

func (e Endpoint) String() string {
	return fmt.Sprintf("%s %s/%d", e.Addr, e.Protocol, e.Port)
}

// CompareEndpoint orders endpoints by address, protocol, port.
func CompareEndpoint(a, b Endpoint) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
}

// Sets is what a Segregated peer may reach, sorted and without duplicates:
// the contents of its two kernel sets.
type Sets struct {
	Peer     string       `json:"peer,omitempty"`
	Pods     []netip.Addr `json:"pods"`
	Services []Endpoint   `json:"services"`
}

// Equal reports whether a and b hold the same elements for the same peer.
func (a Sets) Equal(b Sets) bool {
	return a.Peer == b.Peer && slices.Equal(a.Pods, b.Pods) && slices.Equal(a.Services, b.Services)
}

// Check reports the first address or port of s that cannot be enforced.
// Order and duplicates do not matter: Normal takes care of them.
func (s Sets) Check() error {
	for _, a := range s.Pods {
		if err := checkAddr(a); err != nil {
			return fmt.Errorf("pod %s: %w", a, err)
		}
	}
	for _, e := range s.Services {
		if err := checkAddr(e.Addr); err != nil {
			return fmt.Errorf("service endpoint %s: %w", e.Addr, err)
		}
		if err := checkPort(Port{Protocol: e.Protocol, Port: e.Port}); err != nil {
			return fmt.Errorf("service endpoint %s: %w", e.Addr, err)
		}
	}
	return nil
}

// Normal returns s with its sets sorted and without duplicates, in new
// slices: the form Diff compares.
func (s Sets) Normal() Sets {
	s.Pods = slices.Clone(s.Pods)
	slices.SortFunc(s.Pods, netip.Addr.Compare)
	s.Pods = slices.Compact(s.Pods)
	s.Services = slices.Clone(s.Services)
	slices.SortFunc(s.Services, CompareEndpoint)
	s.Services = slices.Compact(s.Services)
	return s
}

// maxPeerIDLen matches the tunnel's bound: the ID names kernel objects.
const maxPeerIDLen = 64

// Decide computes the sets of every Segregated peer, sorted by peer; Full
// peers get none, which the tunnel reads as "nothing filtered". Bad input
// (a peer twice, an IPv6 address, a port of zero) is an error naming it,
// never a silently smaller or larger set.
func Decide(peers []Peer) ([]Sets, error) {
	seen := map[string]bool{}
	var out []Sets
	for _, p := range peers {
		if err := checkPeerID(p.ID); err != nil {
			return nil, err
		}
		if seen[p.ID] {
			return nil, fmt.Errorf("peer %s: listed twice", p.ID)
		}
		seen[p.ID] = true
		mode, err := ParseMode(string(p.Mode))
		if err != nil {
			return nil, fmt.Errorf("peer %s: %w", p.ID, err)
		}
		if mode == Full {
			continue
		}
		s, err := decidePeer(p)
		if err != nil {
			return nil, fmt.Errorf("peer %s: %w", p.ID, err)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Sets) int { return cmp.Compare(a.Peer, b.Peer) })
	return out, nil
}

func decidePeer(p Peer) (Sets, error) {
	s := Sets{Peer: p.ID}
	for _, a := range p.Pods {
		if err := checkAddr(a); err != nil {
			return Sets{}, fmt.Errorf("offloaded pod %s: %w", a, err)
		}
		s.Pods = append(s.Pods, a)
	}
	for _, svc := range p.Services {
		for _, port := range svc.Ports {
			if err := checkPort(port); err != nil {
				return Sets{}, fmt.Errorf("service %s: %w", svc.Name, err)
			}
		}
		for _, a := range svc.Addresses {
			if err := checkAddr(a); err != nil {
				return Sets{}, fmt.Errorf("service %s: endpoint %s: %w", svc.Name, a, err)
			}
			for _, port := range svc.Ports {
				s.Services = append(s.Services, Endpoint{Addr: a, Protocol: port.Protocol, Port: port.Port})
			}
		}
	}
	return s.Normal(), nil
}

// checkAddr: the tunnel filters IPv4 only; anything else cannot be put
// into its sets and must not be dropped quietly.
func checkAddr(a netip.Addr) error {
	if !a.IsValid() {
		return fmt.Errorf("no address")
	}
	if !a.Is4() {
		return fmt.Errorf("only IPv4 is supported")
	}
	if a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("not a unicast address")
	}
	return nil
}

func checkPort(p Port) error {
	switch p.Protocol {
	case TCP, UDP, SCTP:
	default:
		return fmt.Errorf("protocol %d: want TCP (6), UDP (17) or SCTP (132)", p.Protocol)
	}
	if p.Port == 0 {
		return fmt.Errorf("%s port 0", p.Protocol)
	}
	return nil
}

func checkPeerID(id string) error {
	if id == "" {
		return fmt.Errorf("peer with no cluster ID")
	}
	if len(id) > maxPeerIDLen {
		return fmt.Errorf("peer %.16s...: cluster ID longer than %d bytes", id, maxPeerIDLen)
	}
	for _, r := range id {
		if r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("peer %q: cluster ID may hold only ASCII letters, digits, '-', '_' and '.'", id)
		}
	}
	return nil
}

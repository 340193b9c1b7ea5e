// Package trace answers "why can't X reach Y": given what decides each
// step of a packet's way from a pod of one cluster to a pod of a peer
// (both clusters' Peers, each node's rules and routes, the tunnel's NAT,
// WireGuard peers and policy sets) it walks the packet there and back and
// names the first step that is missing or contradicts another, with what
// to do about it. It reads nothing itself: the agent and the fabric serve
// the kernel state (package observe/trace/live), the command gathers it
// with the Kubernetes objects.
package trace

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// ReportPath is where the agent and the fabric serve a node's report
// (package live reads it from the kernel): collectors read it there.
const ReportPath = "/trace"

// Cluster is one side of a trace: what its API server and its agent and
// fabric pods say.
type Cluster struct {
	// ID is its cluster ID, Name its name (for messages).
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// Peers are its Peer objects.
	Peers []Peer `json:"peers,omitempty"`
	// Gateway is the name of the node the agent runs on ("" when unknown:
	// then every address counts as on the gateway, as with no fabric).
	Gateway string `json:"gateway,omitempty"`
	// Nodes are its nodes: addresses and pod blocks (from the fabric's
	// plan), with their kernel state where it was read.
	Nodes []Node `json:"nodes,omitempty"`
	// Tunnel is the gateway's tunnel as its agent read it; nil: not read.
	Tunnel *Tunnel `json:"tunnel,omitempty"`
	// Pods are the pods a trace may name, by name or by address.
	Pods []Pod `json:"pods,omitempty"`
	// Unread says what could not be read, and why (the agent does not
	// answer, a fabric pod is missing): a step that needs it says so.
	Unread map[string]string `json:"unread,omitempty"`
}

// Peer is a Peer object: the other cluster as this one sees it.
type Peer struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Networking is spec.networking (Accept, Deny or empty).
	Networking string `json:"networking,omitempty"`
	Phase      string `json:"phase,omitempty"`
	// Reason and Message explain the phase (the Accepted or TunnelUp
	// condition that is not True).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Traffic is the mode in effect: Full or Segregated.
	Traffic       string     `json:"traffic,omitempty"`
	PublicKey     string     `json:"publicKey,omitempty"`
	Endpoint      string     `json:"endpoint,omitempty"`
	LastHandshake *time.Time `json:"lastHandshake,omitempty"`
	// Theirs: the peer's networks (Real) as this cluster addresses them
	// (As); Mine: this cluster's networks as the peer addresses them.
	Theirs []View `json:"theirs,omitempty"`
	Mine   []View `json:"mine,omitempty"`
}

// View is how one side addresses a network of the other.
type View struct {
	Real netip.Prefix `json:"real"`
	As   netip.Prefix `json:"as"`
}

// Node is one node, with the kernel state that routes through it.
type Node struct {
	Name      string         `json:"name"`
	Addr      netip.Addr     `json:"addr,omitzero"`
	PodBlocks []netip.Prefix `json:"podBlocks,omitempty"`
	// Kernel is what its fabric pod (or, on the gateway, the agent) read;
	// nil: not read.
	Kernel *Kernel `json:"kernel,omitempty"`
}

// Kernel is a node's routing state as read from its network namespace.
type Kernel struct {
	Rules  []Rule  `json:"rules"`
	Routes []Route `json:"routes"`
	// Exempt are the views in the fabric's masquerade exemption (nftables
	// set views of table flotilla-fabric); nil: the table is not there.
	Exempt []netip.Prefix `json:"exempt"`
	// Overlay is the fabric's VXLAN link's name, when the node has it.
	Overlay string `json:"overlay,omitempty"`
}

// Rule is one IPv4 policy routing rule.
type Rule struct {
	Priority int          `json:"priority"`
	Table    int          `json:"table"`
	Src      netip.Prefix `json:"src,omitzero"`
	Dst      netip.Prefix `json:"dst,omitzero"`
	IifName  string       `json:"iif,omitempty"`
	OifName  string       `json:"oif,omitempty"`
	Mark     uint32       `json:"mark,omitempty"`
	Invert   bool         `json:"invert,omitempty"`
	Protocol int          `json:"protocol,omitempty"`
	// Action is "" for a table lookup, else blackhole, unreachable,
	// prohibit or goto (rules that end the lookup without a table).
	Action string `json:"action,omitempty"`
	// SuppressPrefixlen skips a route found whose prefix is this long or
	// shorter (nil: none), as wg-quick's "suppress_prefixlength 0".
	SuppressPrefixlen *int `json:"suppressPrefixlen,omitempty"`
}

// Route is one IPv4 route.
type Route struct {
	Table    int          `json:"table"`
	Dst      netip.Prefix `json:"dst"`
	Gw       netip.Addr   `json:"gw,omitzero"`
	Dev      string       `json:"dev,omitempty"`
	Protocol int          `json:"protocol"`
	Metric   int          `json:"metric,omitempty"`
	// Type is "" for unicast, else blackhole, unreachable, prohibit or
	// throw.
	Type string `json:"type,omitempty"`
	MTU  int    `json:"mtu,omitempty"`
}

// Tunnel is the gateway's tunnel: its link, WireGuard peers, NAT and
// policy, as read from the kernel.
type Tunnel struct {
	Interface string    `json:"interface"`
	WireGuard []WGPeer  `json:"wireguard"`
	NAT       []PeerNAT `json:"nat"`
	Policy    []Policy  `json:"policy,omitempty"`
	Read      time.Time `json:"read"`
}

// WGPeer is one WireGuard peer on the tunnel's link (never a key but the
// public one).
type WGPeer struct {
	PublicKey     string         `json:"publicKey"`
	Endpoint      string         `json:"endpoint,omitempty"`
	AllowedIPs    []netip.Prefix `json:"allowedIPs"`
	LastHandshake time.Time      `json:"lastHandshake,omitzero"`
}

// PeerNAT is one peer's prefix NAT as the kernel holds it: the views
// whose traffic the egress and ingress maps send to its chains, and the
// rules in them.
type PeerNAT struct {
	Peer         string         `json:"peer"`
	EgressViews  []netip.Prefix `json:"egressViews,omitempty"`
	IngressViews []netip.Prefix `json:"ingressViews,omitempty"`
	SNAT         []Translation  `json:"snat,omitempty"`
	DNAT         []Translation  `json:"dnat,omitempty"`
}

// Translation maps addresses in Match into To, host bits kept.
type Translation struct {
	Match netip.Prefix `json:"match"`
	To    netip.Prefix `json:"to"`
}

// Policy is what a Segregated peer may reach, as the gateway's filter
// holds it.
type Policy struct {
	Peer     string       `json:"peer"`
	Pods     []netip.Addr `json:"pods,omitempty"`
	Services []Endpoint   `json:"services,omitempty"`
}

// Endpoint is an address, protocol and port a Segregated peer may reach.
type Endpoint struct {
	Addr     netip.Addr `json:"addr"`
	Protocol string     `json:"protocol"`
	Port     uint16     `json:"port"`
}

// Pod is a pod a trace may start or end at.
type Pod struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Node      string     `json:"node,omitempty"`
	IP        netip.Addr `json:"ip"`
}

// Well-known numbers of the data path (docs/fabric.md, docs/tunnel.md).
const (
	MainTable    = 254
	FabricTable  = 102
	OurProtocol  = 102
	RulePriority = 20000
)

// NodeReport is what the agent (on the gateway) and each fabric pod serve
// at /trace on their metrics port: the node's kernel state and, from the
// agent, the tunnel's.
type NodeReport struct {
	// Node is the node's name (NODE_NAME), empty where it is not known.
	Node   string  `json:"node,omitempty"`
	Kernel *Kernel `json:"kernel,omitempty"`
	Tunnel *Tunnel `json:"tunnel,omitempty"`
	// Errors say what could not be read.
	Errors []string `json:"errors,omitempty"`
}

// ParseNodeReport decodes a report; fields it does not know (a newer
// agent's) are passed over.
func ParseNodeReport(b []byte) (NodeReport, error) {
	var r NodeReport
	if err := json.Unmarshal(b, &r); err != nil {
		return NodeReport{}, fmt.Errorf("decode trace report: %w", err)
	}
	if r.Kernel != nil {
		for _, rt := range r.Kernel.Routes {
			if !rt.Dst.IsValid() {
				return NodeReport{}, fmt.Errorf("decode trace report: a route without a destination in table %d", rt.Table)
			}
		}
	}
	if r.Tunnel != nil {
		for _, n := range r.Tunnel.NAT {
			for _, t := range append(slices.Clone(n.SNAT), n.DNAT...) {
				if !samePlace(t.Match, t.To) {
					return NodeReport{}, fmt.Errorf("decode trace report: NAT of peer %q maps %s to %s: not IPv4 prefixes of one length", n.Peer, t.Match, t.To)
				}
			}
		}
	}
	return r, nil
}

// Package graph is the federation as its clusters report it: each
// cluster's own report (itself, its Peers, its offloaded namespaces)
// merged into clusters and the links between them, with both sides' views
// of every link, and renderers of that to DOT, JSON and SVG. It reads and
// writes nothing itself: the command and the agent's dashboard gather the
// reports.
package graph

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Report is what one cluster says of itself and of its peers.
type Report struct {
	Self     Self
	Peers    []PeerReport
	Offloads []Offload
}

// Self is a cluster as it knows itself.
type Self struct {
	// ID is its cluster ID; empty when it could not be read (the graph
	// then finds it on another cluster's Peer of the same name).
	ID string
	// Name is its name as it knows it; empty: as its peers know it, else
	// Alias (a kubeconfig's context, say).
	Name, Alias string
	// Nodes is how many real Nodes it has; negative: unknown.
	Nodes int
	// PodCIDRs are its pod ranges; empty: taken from its Peers' MyNetworks.
	PodCIDRs []string
}

// PeerReport is one Peer of a report: the other cluster as this one sees
// it.
type PeerReport struct {
	ID   string
	Name string
	View
}

// View is one side of a link: what one cluster's Peer says of the other.
type View struct {
	Phase    string `json:"phase,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	// LastHandshake is the last WireGuard handshake; HandshakeAgeSeconds
	// its age when the graph was built.
	LastHandshake       *time.Time `json:"lastHandshake,omitempty"`
	HandshakeAgeSeconds *int64     `json:"handshakeAgeSeconds,omitempty"`
	// ReceiveBytes and TransmitBytes are the tunnel's counters, when the
	// reporting agent's metrics were read.
	ReceiveBytes  *uint64 `json:"receiveBytes,omitempty"`
	TransmitBytes *uint64 `json:"transmitBytes,omitempty"`
	// Theirs: the other cluster's ranges as this side addresses them;
	// Mine: this side's ranges as the other addresses them.
	Theirs []NetworkView `json:"theirs,omitempty"`
	Mine   []NetworkView `json:"mine,omitempty"`
	// Networking, Offloading and Traffic are the admin's decisions in the
	// Peer's spec (empty: the agent's policy).
	Networking string `json:"networking,omitempty"`
	Offloading string `json:"offloading,omitempty"`
	Traffic    string `json:"traffic,omitempty"`
	// Hosts: this side is the other's provider, in this tenant namespace.
	// OffloadsTo: the other is this side's provider.
	Hosts      *Grant `json:"hosts,omitempty"`
	OffloadsTo *Grant `json:"offloadsTo,omitempty"`
}

// NetworkView is a range and how the viewing side addresses it.
type NetworkView struct {
	Range string `json:"range"`
	As    string `json:"as"`
}

// Grant is one offloading grant as a side sees it.
type Grant struct {
	// Namespace is the consumer's tenant namespace on the provider.
	Namespace string `json:"namespace"`
	// State is the reason of the Peer's OffloadGranted or
	// OffloadCredential condition, when there is one.
	State   string     `json:"state,omitempty"`
	Expires *time.Time `json:"expires,omitempty"`
}

// Offload is a namespace a cluster extends to its providers.
type Offload struct {
	Namespace string      `json:"namespace"`
	Phase     string      `json:"phase,omitempty"`
	Providers []Placement `json:"providers,omitempty"`
}

// Placement is where an offloaded namespace is on one provider.
type Placement struct {
	ClusterID       string `json:"clusterID"`
	RemoteNamespace string `json:"remoteNamespace,omitempty"`
	// Ready is the status of its Ready condition (True, False, Unknown).
	Ready string `json:"ready,omitempty"`
}

// Graph is the federation: every cluster any report names, and a link for
// every pair one of them peers with.
type Graph struct {
	Clusters []Cluster `json:"clusters"`
	Links    []Link    `json:"links"`
}

// Cluster is one member of the federation.
type Cluster struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// PodCIDRs are its pod ranges, from its own report or, without one,
	// as its peers know them.
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// Nodes is known only from its own report.
	Nodes *int `json:"nodes,omitempty"`
	// Reported: its own report is part of the graph (one of the
	// kubeconfigs given was its).
	Reported bool      `json:"reported"`
	Offloads []Offload `json:"offloadedNamespaces,omitempty"`
}

// Link joins two clusters, A's ID ordered before B's.
type Link struct {
	A string `json:"a"`
	B string `json:"b"`
	// AB is A's Peer for B; BA B's Peer for A. Nil: that side did not
	// report (its kubeconfig was not given) or has no Peer for the other.
	AB *View `json:"aSeesB,omitempty"`
	BA *View `json:"bSeesA,omitempty"`
}

// Build merges the reports into one graph. now dates the handshake ages.
func Build(reports []Report, now time.Time) Graph {
	reports = identify(reports)
	clusters := map[string]*Cluster{}
	cluster := func(id, name string) *Cluster {
		c := clusters[id]
		if c == nil {
			c = &Cluster{ID: id}
			clusters[id] = c
		}
		if c.Name == "" {
			c.Name = name
		}
		return c
	}
	// Own reports first: a cluster's word on itself wins over its peers'.
	for _, r := range reports {
		if c := clusters[r.Self.ID]; c != nil && c.Reported {
			continue // the same cluster twice: its first report stands
		}
		c := cluster(r.Self.ID, r.Self.Name)
		c.Name = cmp.Or(r.Self.Name, c.Name)
		c.Reported = true
		if r.Self.Nodes >= 0 {
			n := r.Self.Nodes
			c.Nodes = &n
		}
		c.PodCIDRs = slices.Clone(r.Self.PodCIDRs)
		if len(c.PodCIDRs) == 0 {
			for _, p := range r.Peers {
				c.PodCIDRs = appendRanges(c.PodCIDRs, p.Mine)
			}
		}
		c.Offloads = append(c.Offloads, r.Offloads...)
	}
	links := map[[2]string]*Link{}
	for _, r := range reports {
		for _, p := range r.Peers {
			if p.ID == "" || p.ID == r.Self.ID {
				continue // no link: a Peer without a name, or for itself
			}
			c := cluster(p.ID, p.Name)
			if !c.Reported {
				c.PodCIDRs = appendRanges(c.PodCIDRs, p.Theirs)
			}
			v := p.View
			if v.LastHandshake != nil {
				age := int64(max(0, now.Sub(*v.LastHandshake)/time.Second))
				v.HandshakeAgeSeconds = &age
			}
			a, b := r.Self.ID, p.ID
			if b < a {
				a, b = b, a
			}
			l := links[[2]string{a, b}]
			if l == nil {
				l = &Link{A: a, B: b}
				links[[2]string{a, b}] = l
			}
			if r.Self.ID == a {
				l.AB = &v
			} else {
				l.BA = &v
			}
		}
	}
	for _, r := range reports {
		if c := clusters[r.Self.ID]; c.Name == "" {
			c.Name = r.Self.Alias
		}
	}
	// Empty lists, not null, for scripts reading the JSON.
	g := Graph{Clusters: []Cluster{}, Links: []Link{}}
	for _, c := range clusters {
		slices.Sort(c.PodCIDRs)
		c.PodCIDRs = slices.Compact(c.PodCIDRs)
		slices.SortFunc(c.Offloads, func(x, y Offload) int { return strings.Compare(x.Namespace, y.Namespace) })
		g.Clusters = append(g.Clusters, *c)
	}
	slices.SortFunc(g.Clusters, func(x, y Cluster) int {
		return cmp.Or(strings.Compare(x.Name, y.Name), strings.Compare(x.ID, y.ID))
	})
	for _, l := range links {
		g.Links = append(g.Links, *l)
	}
	order := map[string]int{}
	for i, c := range g.Clusters {
		order[c.ID] = i
	}
	slices.SortFunc(g.Links, func(x, y Link) int {
		return cmp.Or(cmp.Compare(order[x.A], order[y.A]), cmp.Compare(order[x.B], order[y.B]))
	})
	return g
}

// identify gives a report whose cluster ID could not be read the ID that
// another report's Peer of the same name has, so that both sides of a
// link meet; failing that, its name stands in for the ID.
func identify(reports []Report) []Report {
	out := slices.Clone(reports)
	for i := range out {
		if out[i].Self.ID != "" {
			continue
		}
		for _, r := range reports {
			for _, p := range r.Peers {
				if p.Name != "" && p.Name == out[i].Self.Name {
					out[i].Self.ID = p.ID
				}
			}
		}
		out[i].Self.ID = cmp.Or(out[i].Self.ID, "name:"+cmp.Or(out[i].Self.Name, out[i].Self.Alias))
	}
	return out
}

func appendRanges(to []string, vs []NetworkView) []string {
	for _, v := range vs {
		to = append(to, v.Range)
	}
	return to
}

// Cluster returns the cluster of id, and whether there is one.
func (g Graph) Cluster(id string) (Cluster, bool) {
	for _, c := range g.Clusters {
		if c.ID == id {
			return c, true
		}
	}
	return Cluster{}, false
}

// Label is the cluster's name, or its ID when it has none.
func (c Cluster) Label() string { return cmp.Or(c.Name, c.ID) }

package graph

import (
	"fmt"
	"time"
)

// now is when the fixtures' graphs are built.
var now = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) *time.Time { t := now.Add(-d); return &t }

func count(n uint64) *uint64 { return &n }

// threeClusters is a federation of three, each reporting: a and b
// connected, b's pods remapped on a; c degraded towards a; a offloads
// namespace shop to b, which hosts it.
func threeClusters() []Report {
	const a, b, c = "11111111-aaaa", "22222222-bbbb", "33333333-cccc"
	return []Report{
		{
			Self: Self{ID: a, Name: "alpha", Nodes: 3},
			Peers: []PeerReport{
				{ID: b, Name: "beta", View: View{
					Phase: "Connected", Endpoint: "192.0.2.2:51820", LastHandshake: ago(12 * time.Second),
					ReceiveBytes: count(1536), TransmitBytes: count(3 << 20),
					Theirs:     []NetworkView{{Range: "10.1.0.0/16", As: "10.201.0.0/16"}},
					Mine:       []NetworkView{{Range: "10.1.0.0/16", As: "10.101.0.0/16"}},
					OffloadsTo: &Grant{Namespace: "flotilla-tenant-11111111", State: "CredentialValid"},
				}},
				{ID: c, Name: "gamma", View: View{
					Phase: "Degraded", Endpoint: "192.0.2.3:51820", LastHandshake: ago(10 * time.Minute),
					Theirs: []NetworkView{{Range: "10.3.0.0/16", As: "10.3.0.0/16"}},
					Mine:   []NetworkView{{Range: "10.1.0.0/16", As: "10.1.0.0/16"}},
				}},
			},
			Offloads: []Offload{{Namespace: "shop", Phase: "Ready", Providers: []Placement{{ClusterID: b, RemoteNamespace: "shop-111111", Ready: "True"}}}},
		},
		{
			Self: Self{ID: b, Name: "beta", Nodes: 5},
			Peers: []PeerReport{
				{ID: a, Name: "alpha", View: View{
					Phase: "Connected", Endpoint: "192.0.2.1:51820", LastHandshake: ago(40 * time.Second),
					Theirs:     []NetworkView{{Range: "10.1.0.0/16", As: "10.101.0.0/16"}},
					Mine:       []NetworkView{{Range: "10.1.0.0/16", As: "10.201.0.0/16"}},
					Offloading: "Grant",
					Hosts:      &Grant{Namespace: "flotilla-tenant-11111111", State: "Granted"},
				}},
				{ID: c, Name: "gamma", View: View{
					Phase: "Connected", Endpoint: "192.0.2.3:51820", LastHandshake: ago(5 * time.Second),
					Theirs: []NetworkView{{Range: "10.3.0.0/16", As: "10.3.0.0/16"}},
					Mine:   []NetworkView{{Range: "10.1.0.0/16", As: "10.1.0.0/16"}},
				}},
			},
		},
		{
			Self: Self{ID: c, Name: "gamma", Nodes: 1, PodCIDRs: []string{"10.3.0.0/16"}},
			Peers: []PeerReport{
				{ID: a, Name: "alpha", View: View{Phase: "Degraded", Endpoint: "192.0.2.1:51820", LastHandshake: ago(10 * time.Minute),
					Theirs: []NetworkView{{Range: "10.1.0.0/16", As: "10.1.0.0/16"}}, Mine: []NetworkView{{Range: "10.3.0.0/16", As: "10.3.0.0/16"}}}},
				{ID: b, Name: "beta", View: View{Phase: "Connected", Endpoint: "192.0.2.2:51820", LastHandshake: ago(5 * time.Second),
					Theirs: []NetworkView{{Range: "10.1.0.0/16", As: "10.1.0.0/16"}}, Mine: []NetworkView{{Range: "10.3.0.0/16", As: "10.3.0.0/16"}}}},
			},
		},
	}
}

// fullMesh is n clusters, each peering with every other, each reporting.
func fullMesh(n int) []Report {
	id := func(i int) string { return fmt.Sprintf("%08d-0000-4000-8000-%012d", i, i) }
	name := func(i int) string { return fmt.Sprintf("cluster-%02d-in-a-long-named-region", i) }
	reports := make([]Report, n)
	for i := range n {
		r := Report{Self: Self{ID: id(i), Name: name(i), Nodes: i + 1}}
		for j := range n {
			if j == i {
				continue
			}
			r.Peers = append(r.Peers, PeerReport{ID: id(j), Name: name(j), View: View{
				Phase: "Connected", Endpoint: fmt.Sprintf("192.0.2.%d:51820", j+1), LastHandshake: ago(time.Duration(i+j) * time.Second),
				Theirs: []NetworkView{{Range: fmt.Sprintf("10.%d.0.0/16", j), As: fmt.Sprintf("10.%d.0.0/16", 100+j)}},
				Mine:   []NetworkView{{Range: fmt.Sprintf("10.%d.0.0/16", i), As: fmt.Sprintf("10.%d.0.0/16", 100+i)}},
			}})
		}
		reports[i] = r
	}
	return reports
}

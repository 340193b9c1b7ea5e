package tunnel

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/policy"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestNAT(t *testing.T) {
	key := Key{1}
	tests := []struct {
		name string
		peer Peer
		want []PeerNAT
	}{
		{
			name: "overlap both ways: snat on egress, dnat on ingress",
			peer: Peer{ClusterID: "b", PublicKey: key,
				Views:     []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.70.0.0/16")}},
				ViewsOfMe: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.71.0.0/16")}}},
			want: []PeerNAT{{Peer: "b", Views: []netip.Prefix{pfx("10.70.0.0/16")}, Rules: []NATRule{
				{Kind: SNAT, Match: pfx("10.0.0.0/16"), To: pfx("10.71.0.0/16")},
				{Kind: DNAT, Match: pfx("10.71.0.0/16"), To: pfx("10.0.0.0/16")},
			}}},
		},
		{
			name: "peer sees me as I am: an identity snat, so no later NAT chain rewrites the source",
			peer: Peer{ClusterID: "d", PublicKey: key,
				Views:     []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.72.0.0/16")}},
				ViewsOfMe: []View{{Real: pfx("10.9.0.0/16"), As: pfx("10.9.0.0/16")}}},
			want: []PeerNAT{{Peer: "d", Views: []netip.Prefix{pfx("10.72.0.0/16")}, Rules: []NATRule{
				{Kind: SNAT, Match: pfx("10.9.0.0/16"), To: pfx("10.9.0.0/16")},
			}}},
		},
		{
			name: "peer sees none of my networks: no NAT",
			peer: Peer{ClusterID: "e", PublicKey: key,
				Views: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.72.0.0/16")}}},
			want: nil,
		},
		{
			name: "two networks of mine, one remapped, two views of the peer",
			peer: Peer{ClusterID: "c", PublicKey: key,
				Views: []View{
					{Real: pfx("10.1.0.0/16"), As: pfx("10.81.0.0/16")},
					{Real: pfx("10.0.0.0/16"), As: pfx("10.80.0.0/16")},
				},
				ViewsOfMe: []View{
					{Real: pfx("10.96.0.0/12"), As: pfx("10.96.0.0/12")},
					{Real: pfx("10.0.0.0/16"), As: pfx("10.75.0.0/16")},
				}},
			want: []PeerNAT{{Peer: "c", Views: []netip.Prefix{pfx("10.80.0.0/16"), pfx("10.81.0.0/16")}, Rules: []NATRule{
				{Kind: SNAT, Match: pfx("10.0.0.0/16"), To: pfx("10.75.0.0/16")},
				{Kind: DNAT, Match: pfx("10.75.0.0/16"), To: pfx("10.0.0.0/16")},
				{Kind: SNAT, Match: pfx("10.96.0.0/12"), To: pfx("10.96.0.0/12")},
			}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NAT(Desired{Peers: []Peer{tc.peer}})
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

// Two peers that see me under the same range get the same DNAT, each in
// its own chain reached by source in my (disjoint) views of them, so each
// peer's traffic is translated by its own rule.
func TestNATSameViewOfMeFromTwoPeers(t *testing.T) {
	d := Desired{Networks: []netip.Prefix{pfx("10.0.0.0/16")}, Peers: []Peer{
		{ClusterID: "b", PublicKey: Key{1}, Views: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.70.0.0/16")}},
			ViewsOfMe: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.99.0.0/16")}}},
		{ClusterID: "c", PublicKey: Key{2}, Views: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.71.0.0/16")}},
			ViewsOfMe: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.99.0.0/16")}}},
	}}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	nat := NAT(d)
	if len(nat) != 2 {
		t.Fatalf("got NAT for %d peers, want 2: %v", len(nat), nat)
	}
	if nat[0].Views[0].Overlaps(nat[1].Views[0]) {
		t.Errorf("peers b and c are keyed by overlapping views %s and %s", nat[0].Views[0], nat[1].Views[0])
	}
	keys := map[string]bool{}
	for _, pn := range nat {
		for _, r := range pn.Rules {
			if keys[r.Key(pn.Peer)] {
				t.Errorf("duplicate rule %s", r.Key(pn.Peer))
			}
			keys[r.Key(pn.Peer)] = true
		}
	}
	if len(keys) != 4 {
		t.Errorf("got %d distinct rules, want 4", len(keys))
	}
}

func TestValidate(t *testing.T) {
	good := func() Desired {
		return Desired{Networks: []netip.Prefix{pfx("10.0.0.0/16")}, Peers: []Peer{{
			ClusterID: "b", PublicKey: Key{1}, Endpoint: netip.MustParseAddrPort("198.18.1.2:51820"),
			Views:     []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.70.0.0/16")}},
			ViewsOfMe: []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.71.0.0/16")}},
		}}}
	}
	tests := []struct {
		name   string
		change func(*Desired)
		ok     bool
	}{
		{"valid", func(*Desired) {}, true},
		{"no peers", func(d *Desired) { d.Peers = nil }, true},
		{"host bits set", func(d *Desired) { d.Networks[0] = pfx("10.0.0.1/16") }, false},
		{"ipv6 network", func(d *Desired) { d.Networks[0] = pfx("fd00::/64") }, false},
		{"overlapping local networks", func(d *Desired) { d.Networks = append(d.Networks, pfx("10.0.5.0/24")) }, false},
		{"view of other length", func(d *Desired) { d.Peers[0].Views[0].As = pfx("10.70.0.0/24") }, false},
		{"my view overlaps my network", func(d *Desired) { d.Peers[0].Views[0].As = pfx("10.0.0.0/16") }, false},
		{"two peers under one view", func(d *Desired) {
			p := d.Peers[0]
			p.ClusterID, p.PublicKey = "c", Key{2}
			d.Peers = append(d.Peers, p)
		}, false},
		{"view of one peer inside another's", func(d *Desired) {
			p := d.Peers[0]
			p.ClusterID, p.PublicKey = "c", Key{2}
			p.Views = []View{{Real: pfx("10.0.0.0/24"), As: pfx("10.70.9.0/24")}}
			d.Peers = append(d.Peers, p)
		}, false},
		{"views of two peers side by side", func(d *Desired) {
			p := d.Peers[0]
			p.ClusterID, p.PublicKey = "c", Key{2}
			p.Views = []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.69.0.0/16")}}
			d.Peers = append(d.Peers, p)
		}, true},
		{"duplicate cluster ID", func(d *Desired) {
			p := d.Peers[0]
			p.PublicKey, p.Views = Key{2}, []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.72.0.0/16")}}
			d.Peers = append(d.Peers, p)
		}, false},
		{"duplicate key", func(d *Desired) {
			p := d.Peers[0]
			p.ClusterID, p.Views = "c", []View{{Real: pfx("10.0.0.0/16"), As: pfx("10.72.0.0/16")}}
			d.Peers = append(d.Peers, p)
		}, false},
		{"no key", func(d *Desired) { d.Peers[0].PublicKey = Key{} }, false},
		{"view of a network not mine", func(d *Desired) { d.Peers[0].ViewsOfMe[0].Real = pfx("10.5.0.0/16") }, false},
		{"cluster ID with quote", func(d *Desired) { d.Peers[0].ClusterID = `b" accept` }, false},
		{"no views", func(d *Desired) { d.Peers[0].Views = nil }, false},
		{"endpoint without port", func(d *Desired) { d.Peers[0].Endpoint = netip.MustParseAddrPort("198.18.1.2:0") }, false},
		{"no endpoint", func(d *Desired) { d.Peers[0].Endpoint = netip.AddrPort{} }, true},
		{"host source in my network", func(d *Desired) { d.HostSource = netip.MustParseAddr("10.0.0.1") }, true},
		{"host source outside my networks", func(d *Desired) { d.HostSource = netip.MustParseAddr("10.70.0.1") }, false},
		{"host source the network address", func(d *Desired) { d.HostSource = netip.MustParseAddr("10.0.0.0") }, false},
		{"host source the last address", func(d *Desired) { d.HostSource = netip.MustParseAddr("10.0.255.255") }, false},
		{"host source IPv6", func(d *Desired) { d.HostSource = netip.MustParseAddr("fd00::1") }, false},
		{"host source IPv4-mapped IPv6", func(d *Desired) { d.HostSource = netip.MustParseAddr("::ffff:10.0.0.1") }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := good()
			tc.change(&d)
			err := d.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestParseKey(t *testing.T) {
	priv, err := GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseKey(priv.String() + "\n")
	if err != nil || got != priv {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for _, bad := range []string{"", "not base64!", "AAAA", priv.String() + "AAAA"} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
	// RFC 7748 test vector: Alice's key pair.
	alice, _ := ParseKey("dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=")
	want, _ := ParseKey("hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=")
	if alice.PublicKey() != want {
		t.Errorf("public key of the RFC 7748 vector: %s, want %s", alice.PublicKey(), want)
	}
}

func FuzzParseKey(f *testing.F) {
	f.Add("hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=")
	f.Add("")
	f.Add("====")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			return
		}
		again, err := ParseKey(k.String())
		if err != nil || again != k {
			t.Fatalf("key %q does not round-trip: %v", s, err)
		}
	})
}

// FuzzParseDesired: whatever the input, ParseDesired either refuses it or
// returns a state whose NAT and routes can be computed, whose chain names
// and rule keys are unique and fit the kernel's limits, and whose views
// can be elements of one interval map.
func FuzzParseDesired(f *testing.F) {
	f.Add(`{"networks":["10.0.0.0/16"],"peers":[{"clusterID":"b","publicKey":"hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=","endpoint":"198.18.1.2:51820","views":[{"real":"10.0.0.0/16","as":"10.70.0.0/16"}],"viewsOfMe":[{"real":"10.0.0.0/16","as":"10.71.0.0/16"}]}]}`)
	f.Add(`{"networks":[],"peers":[]}`)
	f.Add(`{"networks":["10.0.0.0/16"],"hostSource":"10.0.0.1","peers":[]}`)
	f.Add(`{"networks":["10.0.0.0/16"],"hostSource":"::ffff:10.0.0.1","peers":[]}`)
	f.Add(`{"networks":["10.0.0.0/16"],"hostSource":"","peers":[]}`)
	f.Add(`{"networks":["10.0.0.0/8"],"peers":[{"clusterID":"x","publicKey":"AA==","endpoint":"[::1]:1","views":[]}]}`)
	f.Add(`{"networks":["10.0.0.0/16"],"peers":[{"clusterID":"b","publicKey":"hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=","views":[{"real":"10.0.0.0/16","as":"10.70.0.0/16"}],"viewsOfMe":[],"segregated":{"pods":["10.0.0.9","10.0.0.5","10.0.0.9"],"services":[{"addr":"10.0.0.7","protocol":6,"port":80},{"addr":"10.0.0.7","protocol":1,"port":0}]}}]}`)
	f.Add(`{"networks":["10.0.0.0/16"],"peers":[{"clusterID":"b","publicKey":"hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=","views":[{"real":"10.0.0.0/16","as":"10.70.0.0/16"}],"viewsOfMe":[],"segregated":{"pods":["fd00::1"]}}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDesired([]byte(s))
		if err != nil {
			return
		}
		if h := d.HostSource; h.IsValid() && (!h.Is4() || !slices.ContainsFunc(d.Networks, func(n netip.Prefix) bool { return n.Contains(h) })) {
			t.Fatalf("host source %s accepted outside my networks %v", h, d.Networks)
		}
		keys := map[string]bool{}
		chains := map[string]bool{}
		var views []netip.Prefix
		for _, pn := range NAT(d) {
			for _, dir := range directions {
				c := dir.peerChain(pn.Peer)
				if chains[c] || c == dir.base || len(c) > 255 {
					t.Fatalf("bad or duplicate chain name %q", c)
				}
				chains[c] = true
			}
			for _, r := range pn.Rules {
				k := r.Key(pn.Peer)
				if len(k) > 200 {
					t.Fatalf("rule key too long for a comment: %d bytes", len(k))
				}
				if keys[k] {
					t.Fatalf("duplicate rule %s", k)
				}
				keys[k] = true
			}
			for _, v := range pn.Views {
				// Interval map elements must not overlap.
				for _, w := range views {
					if v.Overlaps(w) {
						t.Fatalf("views %s and %s overlap in the dispatch maps", v, w)
					}
				}
				views = append(views, v)
			}
		}
		// A Segregated peer's sets hold only what the kernel sets can:
		// IPv4 unicast, TCP/UDP/SCTP on a port, sorted and unique, each
		// service key round-tripping through its kernel encoding.
		for _, pf := range Filters(d) {
			if len(fromChain(pf.Peer)) > 255 || len(servicesSet(pf.Peer)) > 255 {
				t.Fatalf("peer %s: chain or set name too long", pf.Peer)
			}
			if !slices.IsSortedFunc(pf.Pods, netip.Addr.Compare) || len(slices.Compact(slices.Clone(pf.Pods))) != len(pf.Pods) {
				t.Fatalf("peer %s: pods not sorted and unique: %v", pf.Peer, pf.Pods)
			}
			for _, a := range pf.Pods {
				if !a.Is4() || a.IsMulticast() || a.IsUnspecified() {
					t.Fatalf("peer %s: pod %s accepted", pf.Peer, a)
				}
			}
			for _, e := range pf.Services {
				if !e.Addr.Is4() || e.Port == 0 || (e.Protocol != policy.TCP && e.Protocol != policy.UDP && e.Protocol != policy.SCTP) {
					t.Fatalf("peer %s: service endpoint %v accepted", pf.Peer, e)
				}
				if back, ok := parseServiceKey(serviceKeyOf(e)); !ok || back != e {
					t.Fatalf("service key of %v reads back as %v", e, back)
				}
			}
		}
		routes := map[netip.Prefix]bool{}
		for _, p := range Routes(d) {
			if routes[p] {
				t.Fatalf("duplicate route %s", p)
			}
			routes[p] = true
		}
	})
}

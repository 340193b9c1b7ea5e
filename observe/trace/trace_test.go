package trace

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

// standardRules are a node's rules with the fabric's: lookup 102 on a
// worker, iif flotilla0 lookup 102 on the gateway.
func standardRules(iif string) []Rule {
	return []Rule{
		{Priority: 0, Table: 255},
		{Priority: RulePriority, Table: FabricTable, Protocol: OurProtocol, IifName: iif},
		{Priority: 32766, Table: MainTable},
		{Priority: 32767, Table: 253},
	}
}

// side is one cluster of the fixture: both number their pods 10.0.0.0/16;
// a sees b as 10.70.0.0/16, b sees a as 10.71.0.0/16. seenAs is how this
// side addresses the other, seenBy how the other addresses it.
func side(id, name, other, otherName string, lan byte, seenAs, seenBy string, workerBlock string, pod Pod) Cluster {
	gw := netip.AddrFrom4([4]byte{198, 18, lan, 1})
	wk := netip.AddrFrom4([4]byte{198, 18, lan, 2})
	hs := now.Add(-10 * time.Second)
	return Cluster{
		ID: id, Name: name, Gateway: "gw-" + name,
		Peers: []Peer{{
			ID: other, Name: otherName, Phase: "Connected", Traffic: "Full", PublicKey: "key-" + other, Endpoint: "192.0.2.1:51820",
			LastHandshake: &hs,
			Theirs:        []View{{Real: pfx("10.0.0.0/16"), As: pfx(seenAs)}},
			Mine:          []View{{Real: pfx("10.0.0.0/16"), As: pfx(seenBy)}},
		}},
		Nodes: []Node{
			{Name: "gw-" + name, Addr: gw, PodBlocks: []netip.Prefix{pfx("10.0.0.0/24")}, Kernel: &Kernel{
				Rules: standardRules("flotilla0"),
				Routes: []Route{
					{Table: MainTable, Dst: pfx("0.0.0.0/0"), Gw: netip.AddrFrom4([4]byte{198, 18, lan, 254}), Dev: "eth0", Protocol: 3},
					{Table: MainTable, Dst: pfx("10.0.0.0/24"), Dev: "cni0", Protocol: 2},
					{Table: MainTable, Dst: pfx(seenAs), Dev: "flotilla0", Protocol: OurProtocol},
					{Table: FabricTable, Dst: pfx(workerBlock), Gw: wk, Protocol: OurProtocol},
				},
			}},
			{Name: "w-" + name, Addr: wk, PodBlocks: []netip.Prefix{pfx(workerBlock)}, Kernel: &Kernel{
				Rules: standardRules(""),
				Routes: []Route{
					{Table: MainTable, Dst: pfx("0.0.0.0/0"), Gw: netip.AddrFrom4([4]byte{198, 18, lan, 254}), Dev: "eth0", Protocol: 3},
					{Table: MainTable, Dst: pfx(workerBlock), Dev: "cni0", Protocol: 2},
					{Table: FabricTable, Dst: pfx(seenAs), Gw: gw, Protocol: OurProtocol, MTU: 1420},
				},
				Exempt: []netip.Prefix{pfx(seenAs)},
			}},
		},
		Tunnel: &Tunnel{
			Interface: "flotilla0",
			WireGuard: []WGPeer{{PublicKey: "key-" + other, Endpoint: "192.0.2.1:51820", AllowedIPs: []netip.Prefix{pfx(seenAs)}, LastHandshake: hs}},
			NAT: []PeerNAT{{
				Peer: other, EgressViews: []netip.Prefix{pfx(seenAs)}, IngressViews: []netip.Prefix{pfx(seenAs)},
				SNAT: []Translation{{Match: pfx("10.0.0.0/16"), To: pfx(seenBy)}},
				DNAT: []Translation{{Match: pfx(seenBy), To: pfx("10.0.0.0/16")}},
			}},
		},
		Pods: []Pod{pod},
	}
}

func fixture() (a, b Cluster) {
	a = side("aaaa", "a", "bbbb", "b", 1, "10.70.0.0/16", "10.71.0.0/16", "10.0.1.0/24",
		Pod{Namespace: "default", Name: "client", Node: "w-a", IP: ip("10.0.1.5")})
	b = side("bbbb", "b", "aaaa", "a", 2, "10.71.0.0/16", "10.70.0.0/16", "10.0.2.0/24",
		Pod{Namespace: "default", Name: "server", Node: "w-b", IP: ip("10.0.2.7")})
	return a, b
}

// clone copies through JSON, as the command receives the state.
func clone(t *testing.T, c Cluster) Cluster {
	t.Helper()
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var out Cluster
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestHealthyPath(t *testing.T) {
	a, b := fixture()
	for _, dst := range []string{"server", "default/server", "10.70.2.7", "10.0.2.7"} {
		t.Run(dst, func(t *testing.T) {
			ca, cb := clone(t, a), clone(t, b)
			r := Run(&ca, &cb, "client", dst, now)
			if r.Broken != "" {
				t.Fatalf("broken at %s:\n%s", r.Broken, dump(r))
			}
			var ids []string
			for _, s := range r.Steps {
				if s.Verdict != OK {
					t.Errorf("step %s: %s, want ok", s.ID, s.Verdict)
				}
				ids = append(ids, s.ID)
			}
			want := []string{StepSource, StepDestination, StepPeer, StepNodeRoute, StepNodeExemption, StepGatewayRoute, StepSNAT,
				StepWireGuard, StepHandshake, StepFarPeer, StepFarWireGuard, StepFarDNAT, StepFarDelivery, StepFarPolicy, StepFarPod,
				StepReturnNode, StepReturnExempt, StepReturnGateway, StepReturnDelivery}
			if !slices.Equal(ids, want) {
				t.Errorf("steps %q\nwant %q", ids, want)
			}
			if !strings.Contains(r.Destination, "10.70.2.7") || !strings.Contains(r.Source, "10.0.1.5") {
				t.Errorf("ends %q -> %q", r.Source, r.Destination)
			}
		})
	}
}

// TestOneSide: without the peer cluster the far steps are unknown, not
// broken, and the rest is checked.
func TestOneSide(t *testing.T) {
	a, _ := fixture()
	r := Run(&a, nil, "default/client", "10.70.2.7", now)
	if r.Broken != "" {
		t.Fatalf("broken at %s:\n%s", r.Broken, dump(r))
	}
	if s := step(r, StepFarPeer); s == nil || s.Verdict != Unknown || !strings.Contains(s.Fix, "--peer-context") {
		t.Errorf("far side: %+v", s)
	}
	if s := step(r, StepReturnDelivery); s == nil || s.Verdict != OK {
		t.Errorf("return delivery: %+v", s)
	}
}

// TestOneSideViewless: without the peer cluster, an address in no view
// cannot be tied to a peer: the destination step is broken and names
// the peers that hold no views.
func TestOneSideViewless(t *testing.T) {
	a, _ := fixture()
	a.Peers[0].Theirs = nil
	a.Peers[0].Networking = "Deny"
	a.Peers[0].Phase = "Denied"
	r := Run(&a, nil, "default/client", "10.70.2.7", now)
	if r.Broken != StepDestination {
		t.Fatalf("broken at %q, want %q:\n%s", r.Broken, StepDestination, dump(r))
	}
	if s := step(r, StepDestination); !strings.Contains(s.Found, "peers without views") || !strings.Contains(s.Found, "Denied") {
		t.Errorf("destination: %+v", s)
	}
}

// TestGatewayPod: a pod on the gateway skips the worker's steps.
func TestGatewayPod(t *testing.T) {
	a, b := fixture()
	a.Pods = append(a.Pods, Pod{Namespace: "default", Name: "local", Node: "gw-a", IP: ip("10.0.0.9")})
	r := Run(&a, &b, "local", "server", now)
	if r.Broken != "" {
		t.Fatalf("broken at %s:\n%s", r.Broken, dump(r))
	}
	if step(r, StepNodeRoute) != nil {
		t.Errorf("a node route step for a pod on the gateway:\n%s", dump(r))
	}
	if s := step(r, StepReturnDelivery); s == nil || !strings.Contains(s.Found, "cni0") {
		t.Errorf("return delivery: %+v", s)
	}
}

func TestBrokenSteps(t *testing.T) {
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	cases := []struct {
		name   string
		src    string
		dst    string
		break_ func(a, b *Cluster)
		step   string
		fix    string // part of the fix
	}{
		{name: "no such pod", src: "nobody", step: StepSource, fix: "kubectl get pods"},
		{name: "address in no view", dst: "10.99.0.1", step: StepDestination, fix: "kubectl get peers -o wide"},
		{name: "local address", dst: "10.0.0.9", step: StepDestination, fix: "views"},
		{name: "views released", break_: func(a, b *Cluster) { a.Peers[0].Theirs = nil; a.Peers[0].Phase = "Unreachable" },
			dst: "10.70.2.7", step: StepPeer, fix: "is its agent running?"},
		{name: "views released by a deny", break_: func(a, b *Cluster) {
			a.Peers[0].Theirs = nil
			a.Peers[0].Networking = "Deny"
			a.Peers[0].Phase = "Denied"
		}, dst: "10.70.2.7", step: StepPeer, fix: "flotilla peer accept bbbb"},
		{name: "peer denied here", break_: func(a, b *Cluster) { a.Peers[0].Networking = "Deny"; a.Peers[0].Phase = "Denied" },
			step: StepPeer, fix: "flotilla peer accept bbbb"},
		{name: "peer denied there", break_: func(a, b *Cluster) { a.Peers[0].Phase = "Denied" },
			step: StepPeer, fix: "there, flotilla peer accept aaaa"},
		{name: "peer unreachable", break_: func(a, b *Cluster) { a.Peers[0].Phase = "Unreachable" },
			step: StepPeer, fix: "is its agent running?"},
		{name: "peer negotiating", break_: func(a, b *Cluster) { a.Peers[0].Phase = "Negotiating" },
			step: StepPeer, fix: "kubectl get peer bbbb"},
		{name: "foreign rule on the worker", break_: func(a, b *Cluster) {
			k := a.Nodes[1].Kernel
			k.Rules = append(k.Rules, Rule{Priority: 100, Table: 200, Protocol: 4})
			k.Routes = append(k.Routes, Route{Table: 200, Dst: pfx("10.70.0.0/16"), Gw: ip("198.18.1.99"), Protocol: 4})
		}, step: StepNodeRoute, fix: "ip rule del priority 100"},
		{name: "foreign route in table 102", break_: func(a, b *Cluster) {
			k := a.Nodes[1].Kernel
			k.Routes = append(k.Routes, Route{Table: FabricTable, Dst: pfx("10.70.2.0/24"), Gw: ip("198.18.1.99"), Protocol: 3})
		}, step: StepNodeRoute, fix: "ip route del 10.70.2.0/24 table 102"},
		{name: "rule missing on the worker", break_: func(a, b *Cluster) {
			k := a.Nodes[1].Kernel
			k.Rules = slices.DeleteFunc(k.Rules, func(r Rule) bool { return r.Priority == RulePriority })
		}, step: StepNodeRoute, fix: "fabric pod"},
		{name: "view route missing on the worker", break_: func(a, b *Cluster) {
			k := a.Nodes[1].Kernel
			k.Routes = slices.DeleteFunc(k.Routes, func(r Route) bool { return r.Table == FabricTable })
		}, step: StepNodeRoute, fix: "plan"},
		{name: "worker not read", break_: func(a, b *Cluster) {
			a.Nodes[1].Kernel = nil
			a.Unread = map[string]string{"node/w-a": "no fabric pod"}
			// an unknown step is not broken: the next broken one is named
			a.Tunnel.WireGuard = nil
		}, step: StepWireGuard},
		{name: "agent down", break_: func(a, b *Cluster) {
			a.Tunnel = nil
			a.Unread = map[string]string{"agent": "connection refused"}
		}, step: StepAgent, fix: "is the agent running?"},
		{name: "far agent down", break_: func(a, b *Cluster) {
			b.Tunnel = nil
			b.Unread = map[string]string{"agent": "connection refused"}
		}, step: StepFarAgent, fix: "is the agent running?"},
		{name: "exemption missing", break_: func(a, b *Cluster) { a.Nodes[1].Kernel.Exempt = []netip.Prefix{} },
			step: StepNodeExemption, fix: "fabric pod"},
		{name: "foreign route in main on the gateway", break_: func(a, b *Cluster) {
			k := a.Nodes[0].Kernel
			k.Routes = append(k.Routes, Route{Table: MainTable, Dst: pfx("10.70.2.0/24"), Gw: ip("198.18.1.99"), Dev: "eth0", Protocol: 3})
		}, step: StepGatewayRoute, fix: "a foreign route (proto boot) in table main shadows ours: remove it: ip route del 10.70.2.0/24 table main"},
		{name: "tunnel route missing", break_: func(a, b *Cluster) {
			k := a.Nodes[0].Kernel
			k.Routes = slices.DeleteFunc(k.Routes, func(r Route) bool { return r.Dev == "flotilla0" })
		}, step: StepGatewayRoute, fix: "logs deploy/flotilla-agent"},
		{name: "NAT missing", break_: func(a, b *Cluster) { a.Tunnel.NAT = nil }, step: StepSNAT, fix: "nftables"},
		{name: "SNAT contradicts the Peer", break_: func(a, b *Cluster) { a.Tunnel.NAT[0].SNAT[0].To = pfx("10.72.0.0/16") },
			step: StepSNAT, fix: "nftables"},
		{name: "WireGuard peer missing", break_: func(a, b *Cluster) { a.Tunnel.WireGuard = nil }, step: StepWireGuard, fix: "resync"},
		{name: "WireGuard key contradicts the Peer", break_: func(a, b *Cluster) { a.Tunnel.WireGuard[0].PublicKey = "other" },
			step: StepWireGuard, fix: "disagree"},
		{name: "handshake stale", break_: func(a, b *Cluster) { a.Tunnel.WireGuard[0].LastHandshake = *ago(10 * time.Minute) },
			step: StepHandshake, fix: "does not answer"},
		{name: "never a handshake", break_: func(a, b *Cluster) { a.Tunnel.WireGuard[0].LastHandshake = time.Time{} },
			step: StepHandshake, fix: "UDP"},
		{name: "far side denies", break_: func(a, b *Cluster) { b.Peers[0].Networking = "Deny"; b.Peers[0].Phase = "Denied" },
			step: StepFarPeer, fix: "flotilla peer accept aaaa"},
		{name: "far side has no Peer", break_: func(a, b *Cluster) { b.Peers = nil }, step: StepFarPeer, fix: "kubectl get peers"},
		{name: "far WireGuard peer missing", break_: func(a, b *Cluster) { b.Tunnel.WireGuard = nil }, step: StepFarWireGuard, fix: "resync"},
		{name: "far DNAT missing", break_: func(a, b *Cluster) { b.Tunnel.NAT = nil }, step: StepFarDNAT, fix: "NAT back"},
		{name: "far DNAT contradicts the view", break_: func(a, b *Cluster) { b.Tunnel.NAT[0].DNAT[0].To = pfx("10.9.0.0/16") },
			step: StepFarDNAT, fix: "disagree"},
		{name: "far node route missing", break_: func(a, b *Cluster) {
			k := b.Nodes[0].Kernel
			k.Routes = slices.DeleteFunc(k.Routes, func(r Route) bool { return r.Table == FabricTable })
		}, step: StepFarDelivery, fix: "plan lacks the node"},
		{name: "far gateway rule missing", break_: func(a, b *Cluster) {
			k := b.Nodes[0].Kernel
			k.Rules = slices.DeleteFunc(k.Rules, func(r Rule) bool { return r.Priority == RulePriority })
		}, step: StepFarDelivery, fix: "fabric pod on the gateway"},
		{name: "far policy drops", break_: func(a, b *Cluster) {
			b.Peers[0].Traffic = "Segregated"
			b.Tunnel.Policy = []Policy{{Peer: "aaaa", Pods: []netip.Addr{ip("10.0.2.8")}}}
		}, step: StepFarPolicy, fix: "docs/policy.md"},
		{name: "far pod gone", dst: "10.70.2.99", step: StepFarPod, fix: "get pods"},
		{name: "return rule shadowed", break_: func(a, b *Cluster) {
			k := b.Nodes[1].Kernel
			k.Rules = append(k.Rules, Rule{Priority: 10, Table: MainTable, Dst: pfx("10.71.0.0/16")})
		}, step: StepReturnNode, fix: "ip rule del priority 10"},
		{name: "return exemption missing", break_: func(a, b *Cluster) { b.Nodes[1].Kernel.Exempt = nil },
			step: StepReturnExempt, fix: "fabric pod"},
		{name: "return tunnel route missing", break_: func(a, b *Cluster) {
			k := b.Nodes[0].Kernel
			k.Routes = slices.DeleteFunc(k.Routes, func(r Route) bool { return r.Dev == "flotilla0" })
		}, step: StepReturnGateway, fix: "tunnel's route back"},
		{name: "return delivery shadowed", break_: func(a, b *Cluster) {
			k := a.Nodes[0].Kernel
			k.Routes = append(k.Routes, Route{Table: FabricTable, Dst: pfx("10.0.1.0/25"), Dev: "eth0", Protocol: 3})
		}, step: StepReturnDelivery, fix: "ip route del 10.0.1.0/25 table 102"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := fixture()
			a, b = clone(t, a), clone(t, b)
			if c.break_ != nil {
				c.break_(&a, &b)
			}
			src, dst := c.src, c.dst
			if src == "" {
				src = "client"
			}
			if dst == "" {
				dst = "server"
			}
			r := Run(&a, &b, src, dst, now)
			if r.Broken != c.step {
				t.Fatalf("broken at %q, want %q:\n%s", r.Broken, c.step, dump(r))
			}
			s := step(r, c.step)
			if !strings.Contains(s.Fix, c.fix) {
				t.Errorf("fix %q, want it to say %q", s.Fix, c.fix)
			}
		})
	}
}

func step(r Result, id string) *Step {
	for i := range r.Steps {
		if r.Steps[i].ID == id {
			return &r.Steps[i]
		}
	}
	return nil
}

func dump(r Result) string {
	var b strings.Builder
	for _, s := range r.Steps {
		b.WriteString(string(s.Verdict) + "\t" + s.ID + "\t" + s.Where + "\t" + s.Found + "\t" + s.Fix + "\n")
	}
	return b.String()
}

func TestWriteTextNamesTheBrokenStep(t *testing.T) {
	a, b := fixture()
	a.Tunnel.WireGuard = nil
	var out strings.Builder
	if err := WriteText(&out, Run(&a, &b, "client", "server", now)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"default/client (10.0.1.5) -> default/server", "broken   WireGuard peer", "fix: the agent puts the peer back",
		"First broken step: WireGuard peer (cluster a, gateway)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
}

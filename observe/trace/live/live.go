// Package live reads the kernel state a trace needs from the network
// namespace it runs in (the agent's on the gateway, a fabric pod's on any
// node) and serves it as JSON on the metrics port: policy routing rules,
// routes of every table but local, the fabric's masquerade exemption, and
// on the gateway the tunnel's WireGuard peers and NAT. Public keys only;
// the tunnel never hands out its private key.
package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flotilla-io/flotilla/internal/nftinterval"
	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/policy"
	"github.com/flotilla-io/flotilla/tunnel"
)

// Path is where the agent and the fabric serve a node's report.
const Path = trace.ReportPath

// Config names the fabric's objects, as fabric.Config does.
type Config struct {
	// NFTable is the fabric's nftables table (set views in it).
	NFTable string
	// OverlayLink is the fabric's VXLAN link.
	OverlayLink string
}

// ReadKernel reads this network namespace's rules, routes, the fabric's
// exemption set and whether the overlay link exists.
func ReadKernel(cfg Config) (*trace.Kernel, error) {
	if cfg.NFTable == "" {
		cfg.NFTable = "flotilla-fabric"
	}
	if cfg.OverlayLink == "" {
		cfg.OverlayLink = "flotilla-vx"
	}
	k := &trace.Kernel{Rules: []trace.Rule{}, Routes: []trace.Route{}}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
		if l.Attrs().Name == cfg.OverlayLink {
			k.Overlay = cfg.OverlayLink
		}
	}
	rules, err := netlink.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	for _, r := range rules {
		k.Rules = append(k.Rules, ruleOf(r))
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if rt, ok := routeOf(r, names); ok {
			k.Routes = append(k.Routes, rt)
		}
	}
	if k.Exempt, err = exemptViews(cfg.NFTable); err != nil {
		return nil, err
	}
	return k, nil
}

func ruleOf(r netlink.Rule) trace.Rule {
	out := trace.Rule{
		Priority: r.Priority, Table: r.Table, IifName: r.IifName, OifName: r.OifName,
		Mark: r.Mark, Invert: r.Invert, Protocol: int(r.Protocol),
		Src: prefix(r.Src, false), Dst: prefix(r.Dst, false),
	}
	if r.Priority < 0 {
		out.Priority = 0 // the kernel leaves the local rule's out
	}
	if r.Goto >= 0 {
		out.Action = "goto"
	}
	if r.SuppressPrefixlen >= 0 {
		n := r.SuppressPrefixlen
		out.SuppressPrefixlen = &n
	}
	return out
}

var routeTypes = map[int]string{
	unix.RTN_UNICAST: "", unix.RTN_BLACKHOLE: "blackhole", unix.RTN_UNREACHABLE: "unreachable",
	unix.RTN_PROHIBIT: "prohibit", unix.RTN_THROW: "throw",
}

// routeOf converts a route; local, broadcast and multicast routes (and the
// local table) route nothing a trace follows.
func routeOf(r netlink.Route, names map[int]string) (trace.Route, bool) {
	typ, ok := routeTypes[r.Type]
	if !ok || r.Table == unix.RT_TABLE_LOCAL {
		return trace.Route{}, false
	}
	out := trace.Route{
		Table: r.Table, Dst: prefix(r.Dst, true), Dev: names[r.LinkIndex], Protocol: int(r.Protocol),
		Metric: r.Priority, Type: typ, MTU: r.MTU,
	}
	if gw, ok := netip.AddrFromSlice(r.Gw); ok {
		out.Gw = gw.Unmap()
	}
	return out, true
}

// prefix converts; a nil destination is the default route.
func prefix(n *net.IPNet, defaultRoute bool) netip.Prefix {
	if n == nil {
		if defaultRoute {
			return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		return netip.Prefix{}
	}
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

// exemptViews reads the fabric's set of views; nil when its table is not
// there.
func exemptViews(table string) ([]netip.Prefix, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var t *nftables.Table
	for _, x := range tables {
		if x.Name == table {
			t = x
		}
	}
	if t == nil {
		return nil, nil
	}
	s, err := c.GetSetByName(t, "views")
	if err != nil {
		return nil, fmt.Errorf("read set views of nftables table %s: %w", table, err)
	}
	elems, err := c.GetSetElements(s)
	if err != nil {
		return nil, fmt.Errorf("read set views of nftables table %s: %w", table, err)
	}
	out := []netip.Prefix{}
	ivs, _ := nftinterval.Parse(elems)
	for _, iv := range ivs {
		if p, ok := iv.Prefix(); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// TunnelOf converts the tunnel's inspection and its Segregated peers'
// sets into a trace's terms.
func TunnelOf(in tunnel.Inspection, sets []policy.Sets, now time.Time) *trace.Tunnel {
	out := &trace.Tunnel{Interface: in.Interface, WireGuard: []trace.WGPeer{}, NAT: []trace.PeerNAT{}, Read: now}
	for _, p := range in.Peers {
		w := trace.WGPeer{PublicKey: p.PublicKey.String(), AllowedIPs: p.AllowedIPs, LastHandshake: p.LastHandshake}
		if p.Endpoint.IsValid() {
			w.Endpoint = p.Endpoint.String()
		}
		out.WireGuard = append(out.WireGuard, w)
	}
	for _, n := range in.NAT {
		pn := trace.PeerNAT{Peer: n.Peer, EgressViews: n.Egress, IngressViews: n.Ingress}
		for _, r := range n.Rules {
			t := trace.Translation{Match: r.Match, To: r.To}
			if r.Kind == tunnel.SNAT {
				pn.SNAT = append(pn.SNAT, t)
			} else {
				pn.DNAT = append(pn.DNAT, t)
			}
		}
		out.NAT = append(out.NAT, pn)
	}
	for _, s := range sets {
		p := trace.Policy{Peer: s.Peer, Pods: s.Pods}
		for _, e := range s.Services {
			p.Services = append(p.Services, trace.Endpoint{Addr: e.Addr, Protocol: string(e.Protocol), Port: e.Port})
		}
		out.Policy = append(out.Policy, p)
	}
	return out
}

// Handler serves read's report as JSON. A read that fails answers 500
// with the error, which names what could not be read.
func Handler(read func(ctx context.Context) (trace.NodeReport, error), log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rep, err := read(r.Context())
		if err != nil {
			log.Debug("trace report", "err", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(rep); err != nil && !errors.Is(err, context.Canceled) {
			log.Debug("write trace report", "err", err)
		}
	})
}

package harness

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// NATRouter is a home or cloud NAT in front of sites or nodes: a router
// (each site behind it on a routed segment of its own, as with
// NewRouter; nodes on a LAN behind it, NewLANBehind) that is also a
// member of a LAN (interface "lan0"). What leaves by the LAN takes the
// router's LAN address and a port of the router's choosing (masquerade
// with random ports, as carrier-grade and cloud NATs map them), so the
// far side can learn where a flow comes from only from its packets;
// nothing from the LAN gets in except replies to what went out
// (conntrack). So a site behind it can reach the LAN but no member of
// the LAN can reach the site first, the position of a gateway with
// outbound connectivity only.
type NATRouter struct {
	*Router
	// Name is the router's name.
	Name string
	// Addr is the router's address on the LAN: what every site behind
	// it is seen as.
	Addr netip.Addr
}

// natRules are the router's nftables table, in its own namespace.
const natRules = `table ip flotest_nat {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "lan0" masquerade random comment "sites behind the router leave as its LAN address, each flow from a port of its own"
	}
	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state established,related accept comment "replies to what a site sent"
		iifname != "lan0" accept comment "sites out to the LAN"
	}
	chain input {
		type filter hook input priority filter; policy drop;
		ct state established,related accept
		iifname != "lan0" accept
	}
}
`

// NewNATRouter creates a NAT router on lan. Sites go behind it with
// SiteOptions{Router: nat.Router}.
func (e *Env) NewNATRouter(name string, lan *LAN) *NATRouter {
	e.t.Helper()
	r, err := e.newNATRouter(name, lan)
	if err != nil {
		e.fatalf("NAT router %s: %v", name, err)
	}
	return r
}

func (e *Env) newNATRouter(name string, lan *LAN) (*NATRouter, error) {
	r, err := e.newRouter(name)
	if err != nil {
		return nil, err
	}
	addr, err := lan.attach(r.ns, "lan0", "r-"+name)
	if err != nil {
		return nil, fmt.Errorf("attach to LAN: %w", err)
	}
	if err := r.ns.execInput([]byte(natRules), "nft", "-f", "-"); err != nil {
		return nil, fmt.Errorf("NAT rules: %w", err)
	}
	return &NATRouter{Router: r, Name: name, Addr: addr}, nil
}

// NewLANBehind creates a LAN behind nat, as the node network of a
// cluster behind a home or cloud NAT: the router is its first member
// (interface "in-<name>"), and every node or site attached to it later
// routes everything beyond the LAN via the router.
func (e *Env) NewLANBehind(name string, nat *NATRouter) *LAN {
	e.t.Helper()
	l, err := e.newLANBehind(name, nat)
	if err != nil {
		e.fatalf("LAN %s behind NAT router %s: %v", name, nat.Name, err)
	}
	return l
}

func (e *Env) newLANBehind(name string, nat *NATRouter) (*LAN, error) {
	l, err := e.newLAN(name)
	if err != nil {
		return nil, err
	}
	addr, err := l.attach(nat.ns, "in-"+name, "r-"+nat.Name)
	if err != nil {
		return nil, fmt.Errorf("attach the router: %w", err)
	}
	l.mu.Lock()
	l.gateway = addr
	l.mu.Unlock()
	return l, nil
}

// DialContext opens a connection from inside the router: from where a
// member of a LAN behind it is reachable, with no filter between them.
func (r *NATRouter) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return r.ns.DialContext(ctx, network, addr)
}

// Mappings are the router's addresses and ports (on the LAN) of the
// flows of proto ("udp" or "tcp") that inside, an address and port
// behind the router, opened to the LAN: what the far side of each flow
// sees as its source, read from the router's connection tracking.
func (r *NATRouter) Mappings(ctx context.Context, proto string, inside netip.AddrPort) ([]netip.AddrPort, error) {
	out, err := r.ns.Exec(ctx, "cat", "/proc/net/nf_conntrack")
	if err != nil {
		return nil, fmt.Errorf("connection tracking of NAT router %s: %w", r.Name, err)
	}
	return natMappings(string(out), proto, inside), nil
}

// natMappings reads nf_conntrack's lines: an entry is its original tuple
// (src= dst= sport= dport=) then its reply tuple, whose destination is
// where replies go, the mapping.
func natMappings(table, proto string, inside netip.AddrPort) []netip.AddrPort {
	var found []netip.AddrPort
	for _, line := range strings.Split(table, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[2] != proto {
			continue
		}
		var tuples [2]map[string]string
		i := -1
		for _, f := range fields {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			if k == "src" {
				i++
				if i > 1 {
					break
				}
				tuples[i] = map[string]string{}
			}
			if i >= 0 && i <= 1 {
				tuples[i][k] = v
			}
		}
		if tuples[1] == nil || tuples[0]["src"] != inside.Addr().String() || tuples[0]["sport"] != strconv.Itoa(int(inside.Port())) {
			continue
		}
		mapped, err := netip.ParseAddrPort(net.JoinHostPort(tuples[1]["dst"], tuples[1]["dport"]))
		if err == nil {
			found = append(found, mapped)
		}
	}
	return found
}

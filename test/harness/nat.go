package harness

import (
	"fmt"
	"net/netip"
)

// NATRouter is a home or cloud NAT in front of sites: a router (each site
// behind it on a routed segment of its own, as with NewRouter) that is
// also a member of a LAN (interface "lan0"). What leaves by the LAN takes
// the router's LAN address (masquerade); nothing from the LAN gets in
// except replies to what went out (conntrack). So a site behind it can
// reach the LAN but no member of the LAN can reach the site first, the
// position of a gateway with outbound connectivity only.
type NATRouter struct {
	*Router
	// Addr is the router's address on the LAN: what every site behind
	// it is seen as.
	Addr netip.Addr
}

// natRules are the router's nftables table, in its own namespace.
const natRules = `table ip flotest_nat {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "lan0" masquerade comment "sites behind the router leave as its LAN address"
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
	return &NATRouter{Router: r, Addr: addr}, nil
}

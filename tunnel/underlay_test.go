package tunnel_test

import (
	"net/netip"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// DefaultRoute finds the link, gateway, source address and MTU of the
// default route the kernel prefers, and says when there is none.
func TestDefaultRoute(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routed bool // behind a router (default route via it), else on a LAN
		setup  func(s *harness.Site)
		want   func(s *harness.Site) tunnel.Underlay // nil: no default route
	}{
		{
			name: "behind a router", routed: true,
			want: func(s *harness.Site) tunnel.Underlay {
				gw := s.Addr.As4()
				gw[3] = 1
				return tunnel.Underlay{Link: "wan0", MTU: 1500, Gateway: netip.AddrFrom4(gw), Src: s.Addr}
			},
		},
		{
			name: "lowest metric wins, with its preferred source",
			setup: func(s *harness.Site) {
				other := addOtherLink(s)
				s.MustExec("ip", "addr", "add", "192.0.2.1/24", "dev", other)
				s.MustExec("ip", "route", "add", "default", "dev", other, "metric", "100")
				s.MustExec("ip", "addr", "add", "192.168.77.5/32", "dev", "lan0")
				s.MustExec("ip", "route", "add", "default", "via", lanGateway(s).String(), "dev", "lan0", "metric", "10", "src", "192.168.77.5")
			},
			want: func(s *harness.Site) tunnel.Underlay {
				return tunnel.Underlay{Link: "lan0", MTU: 1500, Gateway: lanGateway(s), Src: netip.MustParseAddr("192.168.77.5")}
			},
		},
		{
			name: "on the link, no gateway",
			setup: func(s *harness.Site) {
				other := addOtherLink(s)
				s.MustExec("ip", "link", "set", other, "mtu", "1400")
				s.MustExec("ip", "addr", "add", "192.0.2.1/24", "dev", other)
				s.MustExec("ip", "route", "add", "default", "dev", other)
			},
			want: func(*harness.Site) tunnel.Underlay {
				return tunnel.Underlay{Link: "other0", MTU: 1400, Src: netip.MustParseAddr("192.0.2.1")}
			},
		},
		{name: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := harness.New(t)
			env.Require(harness.Root, harness.IPRoute2)
			opts := harness.SiteOptions{}
			if tc.routed {
				opts.Router = env.NewRouter("r")
			} else {
				opts.LAN = env.NewLAN("lan")
			}
			s := env.NewSite("a", opts)
			if tc.setup != nil {
				tc.setup(s)
			}
			var got tunnel.Underlay
			err := s.Do(func() (err error) { got, err = tunnel.DefaultRoute(); return err })
			if tc.want == nil {
				if err == nil {
					t.Fatalf("DefaultRoute with none: %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want(s)
			got.LinkIndex = 0 // differs per namespace
			if got != want {
				t.Errorf("DefaultRoute: %+v, want %+v", got, want)
			}
		})
	}
}

// lanGateway is an address on the site's LAN to route through.
func lanGateway(s *harness.Site) netip.Addr {
	a := s.Addr.As4()
	a[3] = 254
	return netip.AddrFrom4(a)
}

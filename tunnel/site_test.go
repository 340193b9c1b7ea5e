package tunnel_test

import (
	"os"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
	"github.com/flotilla-io/flotilla/tunnel"
)

// siteTunnel runs a userspace tunnel inside this test process, in a fresh
// site on a LAN, with cfg's settings where given; the test calls into it
// through site.Do. The tunnel is cleaned up when the test ends. It
// returns the config the tunnel runs with.
func siteTunnel(t testing.TB, cfg tunnel.Config) (*harness.Site, *tunnel.Tunnel, tunnel.Config) {
	t.Helper()
	env := harness.New(t)
	env.Require(harness.Root, harness.IPRoute2)
	lan := env.NewLAN("lan")
	site := env.NewSite("a", harness.SiteOptions{LAN: lan, PodCIDR: mustPrefix("10.0.0.0/24")})
	if cfg.Interface == "" {
		cfg.Interface = env.LinkName("t")
	}
	cfg.Mode = tunnel.ModeUserspace
	if cfg.ListenPort == 0 {
		cfg.ListenPort = 20000 + os.Getpid()%10000 // below the ephemeral range
	}
	var tun *tunnel.Tunnel
	if err := site.Do(func() error {
		key, err := tunnel.GeneratePrivateKey()
		if err != nil {
			return err
		}
		cfg.PrivateKey = key
		tun, err = tunnel.New(cfg)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { site.Do(tun.Cleanup) })
	return site, tun, cfg
}

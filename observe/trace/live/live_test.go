package live

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/observe/trace"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestReadKernel reads a real network namespace: the rules, the routes of
// every table but local, and the fabric's exemption set, in the terms a
// trace looks them up in.
func TestReadKernel(t *testing.T) {
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	site := env.NewSite("s", harness.SiteOptions{LAN: env.NewLAN("lan")})
	read := func() *trace.Kernel {
		t.Helper()
		var k *trace.Kernel
		if err := site.Do(func() (err error) { k, err = ReadKernel(Config{}); return err }); err != nil {
			t.Fatal(err)
		}
		return k
	}
	if k := read(); k.Exempt != nil {
		t.Errorf("no table flotilla-fabric, yet exempt %v", k.Exempt)
	}
	site.MustExec("ip", "rule", "add", "priority", "20000", "lookup", "102", "proto", "102")
	site.MustExec("ip", "rule", "add", "priority", "100", "lookup", "main", "suppress_prefixlength", "0")
	site.MustExec("ip", "route", "add", "10.70.0.0/16", "dev", "lan0", "table", "102", "proto", "102", "mtu", "1420")
	site.MustExec("ip", "route", "add", "blackhole", "10.70.2.0/24", "table", "102", "proto", "boot")
	site.MustExec("nft", "add table ip flotilla-fabric; add set ip flotilla-fabric views { type ipv4_addr; flags interval; elements = { 10.70.0.0/16, 10.80.0.0/24 } }")
	k := read()

	if !slices.ContainsFunc(k.Rules, func(r trace.Rule) bool {
		return r.Priority == 20000 && r.Table == 102 && r.Protocol == 102 && r.Action == "" && r.SuppressPrefixlen == nil
	}) {
		t.Errorf("our rule not read: %+v", k.Rules)
	}
	if !slices.ContainsFunc(k.Rules, func(r trace.Rule) bool {
		return r.Priority == 100 && r.Table == trace.MainTable && r.SuppressPrefixlen != nil && *r.SuppressPrefixlen == 0
	}) {
		t.Errorf("suppress_prefixlength 0 not read: %+v", k.Rules)
	}
	if !slices.ContainsFunc(k.Routes, func(r trace.Route) bool {
		return r.Table == 102 && r.Dst == netip.MustParsePrefix("10.70.0.0/16") && r.Dev == "lan0" && r.Protocol == 102 && r.MTU == 1420 && r.Type == ""
	}) {
		t.Errorf("our route not read: %+v", k.Routes)
	}
	if !slices.ContainsFunc(k.Routes, func(r trace.Route) bool {
		return r.Table == 102 && r.Dst == netip.MustParsePrefix("10.70.2.0/24") && r.Protocol == 3 && r.Type == "blackhole"
	}) {
		t.Errorf("the blackhole route not read: %+v", k.Routes)
	}
	if slices.ContainsFunc(k.Routes, func(r trace.Route) bool { return r.Table == 255 }) {
		t.Errorf("the local table was read")
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.70.0.0/16"), netip.MustParsePrefix("10.80.0.0/24")}; !slices.Equal(k.Exempt, want) {
		t.Errorf("exempt %v, want %v", k.Exempt, want)
	}
}

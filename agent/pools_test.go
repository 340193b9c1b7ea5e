package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/ipam"
)

// The agent's metrics show how full each remap pool is: a view of a
// peer's overlapping range takes its block from the first pool.
func TestRemapPoolMetrics(t *testing.T) {
	l := openLedger(t)
	if _, err := l.SetLocalNetworks([]ipam.LocalNetwork{{Range: netip.MustParsePrefix("10.0.0.0/16"), Kind: ipam.PodNetwork}}); err != nil {
		t.Fatal(err)
	}
	if v, err := l.ViewOf("cpeer", netip.MustParsePrefix("10.0.0.0/16")); err != nil || v != netip.MustParsePrefix("100.96.0.0/16") {
		t.Fatalf("ViewOf = %v, %v", v, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newPoolCollector(l))
	want := `
# HELP flotilla_remap_pool_used_addresses Addresses of a remap pool taken by views, blocks in quarantine after a peer released them, and local networks.
# TYPE flotilla_remap_pool_used_addresses gauge
flotilla_remap_pool_used_addresses{family="ipv4",pool="100.64.0.0/11"} 0
flotilla_remap_pool_used_addresses{family="ipv4",pool="100.96.0.0/11"} 65536
flotilla_remap_pool_used_addresses{family="ipv6",pool="fddc:467:9000::/40"} 0
# HELP flotilla_remap_pool_addresses Addresses in a remap pool, which views of peers' overlapping ranges are drawn from.
# TYPE flotilla_remap_pool_addresses gauge
flotilla_remap_pool_addresses{family="ipv4",pool="100.64.0.0/11"} 2.097152e+06
flotilla_remap_pool_addresses{family="ipv4",pool="100.96.0.0/11"} 2.097152e+06
flotilla_remap_pool_addresses{family="ipv6",pool="fddc:467:9000::/40"} 3.094850098213451e+26
# HELP flotilla_remap_pool_largest_free_block_addresses Addresses in the largest free aligned block of a remap pool: a peer range larger than this can no longer be remapped into it (0: full).
# TYPE flotilla_remap_pool_largest_free_block_addresses gauge
flotilla_remap_pool_largest_free_block_addresses{family="ipv4",pool="100.64.0.0/11"} 2.097152e+06
flotilla_remap_pool_largest_free_block_addresses{family="ipv4",pool="100.96.0.0/11"} 1.048576e+06
flotilla_remap_pool_largest_free_block_addresses{family="ipv6",pool="fddc:467:9000::/40"} 3.094850098213451e+26
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

package agent

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/ipam"
)

// poolCollector exports the remap pools' usage from the ledger when
// scraped, so that an operator is warned before a peer's view finds no
// room (its Peer then says ViewsAgreed PoolExhausted). A view takes the
// first pool of its family with room, so alerts sum by family: one pool
// covered by a local network is no alarm while another has room.
type poolCollector struct {
	ledger                 *ipam.Ledger
	addresses, used, large *prometheus.Desc
}

func newPoolCollector(ledger *ipam.Ledger) *poolCollector {
	return &poolCollector{
		ledger: ledger,
		addresses: prometheus.NewDesc("flotilla_remap_pool_addresses",
			"Addresses in a remap pool, which views of peers' overlapping ranges are drawn from.", []string{"pool", "family"}, nil),
		used: prometheus.NewDesc("flotilla_remap_pool_used_addresses",
			"Addresses of a remap pool taken by views, blocks in quarantine after a peer released them, and local networks.", []string{"pool", "family"}, nil),
		large: prometheus.NewDesc("flotilla_remap_pool_largest_free_block_addresses",
			"Addresses in the largest free aligned block of a remap pool: a peer range larger than this can no longer be remapped into it (0: full).", []string{"pool", "family"}, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.addresses
	ch <- c.used
	ch <- c.large
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.ledger.PoolUsage() {
		pool, family := u.Pool.String(), "ipv6"
		if u.Pool.Addr().Is4() {
			family = "ipv4"
		}
		largest := 0.0
		if u.LargestFree >= 0 {
			largest = math.Ldexp(1, u.Pool.Addr().BitLen()-u.LargestFree)
		}
		ch <- prometheus.MustNewConstMetric(c.addresses, prometheus.GaugeValue, u.Addresses, pool, family)
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, u.Used, pool, family)
		ch <- prometheus.MustNewConstMetric(c.large, prometheus.GaugeValue, largest, pool, family)
	}
}

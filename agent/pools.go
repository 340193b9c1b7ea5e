package agent

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flotilla-io/flotilla/ipam"
)

// poolCollector exports the remap pools' usage from the ledger when
// scraped, so that an operator is warned before a peer's view finds no
// room (its Peer then says ViewsAgreed PoolExhausted).
type poolCollector struct {
	ledger                 *ipam.Ledger
	addresses, used, large *prometheus.Desc
}

func newPoolCollector(ledger *ipam.Ledger) *poolCollector {
	return &poolCollector{
		ledger: ledger,
		addresses: prometheus.NewDesc("flotilla_remap_pool_addresses",
			"Addresses in a remap pool, which views of peers' overlapping ranges are drawn from.", []string{"pool"}, nil),
		used: prometheus.NewDesc("flotilla_remap_pool_used_addresses",
			"Addresses of a remap pool taken by views, blocks in quarantine after a peer released them, and local networks.", []string{"pool"}, nil),
		large: prometheus.NewDesc("flotilla_remap_pool_largest_free_block_addresses",
			"Addresses in the largest free aligned block of a remap pool: a peer range larger than this can no longer be remapped into it (0: full).", []string{"pool"}, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.addresses
	ch <- c.used
	ch <- c.large
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.ledger.PoolUsage() {
		pool := u.Pool.String()
		largest := 0.0
		if u.LargestFree >= 0 {
			largest = math.Ldexp(1, u.Pool.Addr().BitLen()-u.LargestFree)
		}
		ch <- prometheus.MustNewConstMetric(c.addresses, prometheus.GaugeValue, u.Addresses, pool)
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, u.Used, pool)
		ch <- prometheus.MustNewConstMetric(c.large, prometheus.GaugeValue, largest, pool)
	}
}

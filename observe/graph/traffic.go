package graph

import (
	"fmt"
	"io"
	"math"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The agent's tunnel counters, per peer (peering's metrics).
const (
	receiveMetric  = "flotilla_peer_receive_bytes_total"
	transmitMetric = "flotilla_peer_transmit_bytes_total"
)

// Counters are a peer's tunnel byte counters.
type Counters struct{ Receive, Transmit *uint64 }

// TrafficOf picks the tunnel counters of each peer, by cluster ID, out
// of an agent's metrics.
func TrafficOf(families []*dto.MetricFamily) map[string]Counters {
	out := map[string]Counters{}
	for _, f := range families {
		name := f.GetName()
		if name != receiveMetric && name != transmitMetric {
			continue
		}
		for _, m := range f.GetMetric() {
			var peer string
			for _, l := range m.GetLabel() {
				if l.GetName() == "peer" {
					peer = l.GetValue()
				}
			}
			v := value(m)
			// NaN, negative or infinite: no count to show.
			if peer == "" || !(v >= 0) || math.IsInf(v, 1) {
				continue
			}
			n := uint64(v)
			c := out[peer]
			if name == receiveMetric {
				c.Receive = &n
			} else {
				c.Transmit = &n
			}
			out[peer] = c
		}
	}
	return out
}

// value is a counter's or untyped sample's value; -1 when it has none.
func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return -1
}

// ParseTraffic reads the tunnel counters out of an agent's /metrics
// page in Prometheus's text format.
func ParseTraffic(r io.Reader) (map[string]Counters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("read the agent's metrics: %w", err)
	}
	list := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		list = append(list, f)
	}
	return TrafficOf(list), nil
}

// WithTraffic sets each peer's counters from traffic, keyed by cluster ID.
func (r *Report) WithTraffic(traffic map[string]Counters) {
	for i := range r.Peers {
		if c, ok := traffic[r.Peers[i].ID]; ok {
			r.Peers[i].ReceiveBytes, r.Peers[i].TransmitBytes = c.Receive, c.Transmit
		}
	}
}

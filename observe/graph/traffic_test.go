package graph

import (
	"strings"
	"testing"
)

const metricsPage = `# HELP flotilla_peer_receive_bytes_total Bytes received through the tunnel from the peer.
# TYPE flotilla_peer_receive_bytes_total counter
flotilla_peer_receive_bytes_total{peer="22222222-bbbb"} 1536
flotilla_peer_receive_bytes_total{peer="33333333-cccc"} 0
# HELP flotilla_peer_transmit_bytes_total Bytes sent through the tunnel to the peer.
# TYPE flotilla_peer_transmit_bytes_total counter
flotilla_peer_transmit_bytes_total{peer="22222222-bbbb"} 3.145728e+06
# TYPE flotilla_peers gauge
flotilla_peers{phase="Connected"} 2
`

func TestParseTraffic(t *testing.T) {
	got, err := ParseTraffic(strings.NewReader(metricsPage))
	if err != nil {
		t.Fatal(err)
	}
	b := got["22222222-bbbb"]
	if b.Receive == nil || *b.Receive != 1536 || b.Transmit == nil || *b.Transmit != 3<<20 {
		t.Errorf("beta's counters = %+v, want rx 1536 tx 3 MiB", b)
	}
	c := got["33333333-cccc"]
	if c.Receive == nil || *c.Receive != 0 || c.Transmit != nil {
		t.Errorf("gamma's counters = %+v, want rx 0 and no tx", c)
	}
	if len(got) != 2 {
		t.Errorf("counters of %d peers, want 2: %v", len(got), got)
	}
	r := threeClusters()[0]
	r.Peers[0].ReceiveBytes, r.Peers[0].TransmitBytes = nil, nil
	r.WithTraffic(got)
	if v := r.Peers[0].View; v.Counters() != "rx 1.5 KiB, tx 3.0 MiB" {
		t.Errorf("alpha's view of beta shows %q, want rx 1.5 KiB, tx 3.0 MiB", v.Counters())
	}
}

func TestParseTrafficRefusesGarbage(t *testing.T) {
	if _, err := ParseTraffic(strings.NewReader("flotilla_peer_receive_bytes_total{peer=\"x\" 12\n")); err == nil {
		t.Error("a broken metrics page parsed without error")
	}
}

// The metrics page comes from an agent over the network: whatever it
// says, parsing returns counters or an error.
func FuzzParseTraffic(f *testing.F) {
	f.Add(metricsPage)
	f.Add("flotilla_peer_receive_bytes_total{peer=\"a\"} -5\n")
	f.Add("flotilla_peer_transmit_bytes_total{peer=\"a\"} NaN\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, page string) {
		got, err := ParseTraffic(strings.NewReader(page))
		if err != nil {
			return
		}
		for peer := range got {
			if peer == "" {
				t.Errorf("counters for an empty peer ID from %q", page)
			}
		}
	})
}

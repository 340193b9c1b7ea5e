package harness

import "testing"

func TestIPerf3Gbps(t *testing.T) {
	report := []byte(`{"start":{},"end":{"sum_sent":{"bits_per_second":2.5e9},"sum_received":{"bits_per_second":2.25e9}}}`)
	if g, err := IPerf3Gbps(report); err != nil || g != 2.25 {
		t.Fatalf("IPerf3Gbps = %v, %v; want 2.25 (what the server received)", g, err)
	}
	if _, err := IPerf3Gbps([]byte("iperf3: error - unable to connect to server")); err == nil {
		t.Fatal("a report that is not JSON gave no error")
	}
}

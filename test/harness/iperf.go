package harness

import (
	"encoding/json"
	"fmt"
)

// IPerf3Gbps is the throughput an iperf3 client's JSON report (-J) says
// its server received, in Gbit/s.
func IPerf3Gbps(report []byte) (float64, error) {
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(report, &res); err != nil {
		return 0, fmt.Errorf("iperf3 report: %w", err)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, nil
}

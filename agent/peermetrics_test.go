package agent

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// series lists what reg serves of family name, each as its labels
// name=value joined by commas, sorted.
func series(t *testing.T, g prometheus.Gatherer, name string) []string {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out = append(out, strings.Join(labels, ","))
		}
	}
	slices.Sort(out)
	return out
}

// Each peer's series carry its name beside its ID, one series whatever
// the name: a renamed peer's series are replaced, a forgotten peer's
// deleted from the vectors that hold them; series of peers the engine
// does not know, and before it runs, pass as they are.
func TestPeerMetricsNameEachPeer(t *testing.T) {
	reg := newPeerMetrics(prometheus.NewRegistry())
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_errors_total", Help: "h"}, []string{"peer", "reason"})
	reg.MustRegister(errs)
	errs.WithLabelValues("id1", "quota").Inc()
	errs.WithLabelValues("id2", "quota").Inc()
	errs.WithLabelValues("stranger", "quota").Inc()

	if got, want := series(t, reg, "test_errors_total"), []string{"peer=id1,reason=quota", "peer=id2,reason=quota", "peer=stranger,reason=quota"}; !slices.Equal(got, want) {
		t.Errorf("before the engine runs: %v, want %v", got, want)
	}

	names := map[string]string{"id1": "paris", "id2": "lyon"}
	reg.nameFrom(func() map[string]string { return maps.Clone(names) })
	for _, step := range []struct {
		what  string
		names map[string]string
		want  []string
	}{
		{"named", map[string]string{"id1": "paris", "id2": "lyon"},
			[]string{"peer=id1,peer_name=paris,reason=quota", "peer=id2,peer_name=lyon,reason=quota", "peer=stranger,reason=quota"}},
		{"id1 renamed", map[string]string{"id1": "marseille", "id2": "lyon"},
			[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=id2,peer_name=lyon,reason=quota", "peer=stranger,reason=quota"}},
		{"id2 not named yet", map[string]string{"id1": "marseille", "id2": ""},
			[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=id2,reason=quota", "peer=stranger,reason=quota"}},
		{"id2 forgotten", map[string]string{"id1": "marseille"},
			[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=stranger,reason=quota"}},
	} {
		names = step.names
		if got := series(t, reg, "test_errors_total"); !slices.Equal(got, step.want) {
			t.Errorf("%s: %v, want %v", step.what, got, step.want)
		}
	}
	// Deleted from the vector itself, not only hidden.
	if n := errs.DeletePartialMatch(prometheus.Labels{"peer": "id2"}); n != 0 {
		t.Errorf("the vector still held %d series of the forgotten peer", n)
	}
	// A series naming its peer already is left as it is.
	phase := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_phase", Help: "h"}, []string{"peer", "peer_name"})
	reg.MustRegister(phase)
	phase.WithLabelValues("id1", "marseille").Set(1)
	if got, want := series(t, reg, "test_phase"), []string{"peer=id1,peer_name=marseille"}; !slices.Equal(got, want) {
		t.Errorf("a named series: %v, want %v", got, want)
	}
}

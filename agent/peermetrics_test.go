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
// the name, under every label that holds a peer's ID (peer; consumer and
// cluster of a series about two clusters): a renamed peer's series are
// replaced, a forgotten peer's deleted from the vectors that hold them,
// whichever label names it, and again when a collector makes one after,
// until the peer is back; series of peers the engine does not know,
// and before it runs, pass as they are.
func TestPeerMetricsNameEachPeer(t *testing.T) {
	reg := newPeerMetrics(prometheus.NewRegistry())
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_errors_total", Help: "h"}, []string{"peer", "reason"})
	third := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_third_total", Help: "h"}, []string{"consumer", "cluster"})
	reg.MustRegister(errs, third)
	errs.WithLabelValues("id1", "quota").Inc()
	errs.WithLabelValues("id2", "quota").Inc()
	errs.WithLabelValues("stranger", "quota").Inc()
	third.WithLabelValues("id1", "id2").Inc()
	third.WithLabelValues("id2", "id1").Inc()
	third.WithLabelValues("id1", "stranger").Inc()

	type want struct{ errs, third []string }
	check := func(what string, w want) {
		t.Helper()
		if got := series(t, reg, "test_errors_total"); !slices.Equal(got, w.errs) {
			t.Errorf("%s: %v, want %v", what, got, w.errs)
		}
		if got := series(t, reg, "test_third_total"); !slices.Equal(got, w.third) {
			t.Errorf("%s: %v, want %v", what, got, w.third)
		}
	}
	check("before the engine runs", want{
		[]string{"peer=id1,reason=quota", "peer=id2,reason=quota", "peer=stranger,reason=quota"},
		[]string{"cluster=id1,consumer=id2", "cluster=id2,consumer=id1", "cluster=stranger,consumer=id1"}})

	names := map[string]string{"id1": "paris", "id2": "lyon"}
	reg.nameFrom(func() map[string]string { return maps.Clone(names) })
	for _, step := range []struct {
		what  string
		names map[string]string
		want  want
	}{
		{"named", map[string]string{"id1": "paris", "id2": "lyon"}, want{
			[]string{"peer=id1,peer_name=paris,reason=quota", "peer=id2,peer_name=lyon,reason=quota", "peer=stranger,reason=quota"},
			[]string{"cluster=id1,cluster_name=paris,consumer=id2,consumer_name=lyon", "cluster=id2,cluster_name=lyon,consumer=id1,consumer_name=paris",
				"cluster=stranger,consumer=id1,consumer_name=paris"}}},
		{"id1 renamed", map[string]string{"id1": "marseille", "id2": "lyon"}, want{
			[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=id2,peer_name=lyon,reason=quota", "peer=stranger,reason=quota"},
			[]string{"cluster=id1,cluster_name=marseille,consumer=id2,consumer_name=lyon", "cluster=id2,cluster_name=lyon,consumer=id1,consumer_name=marseille",
				"cluster=stranger,consumer=id1,consumer_name=marseille"}}},
		{"id2 not named yet", map[string]string{"id1": "marseille", "id2": ""}, want{
			[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=id2,reason=quota", "peer=stranger,reason=quota"},
			[]string{"cluster=id1,cluster_name=marseille,consumer=id2", "cluster=id2,consumer=id1,consumer_name=marseille",
				"cluster=stranger,consumer=id1,consumer_name=marseille"}}},
		{"id2 forgotten", map[string]string{"id1": "marseille"}, want{
			[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=stranger,reason=quota"},
			[]string{"cluster=stranger,consumer=id1,consumer_name=marseille"}}},
	} {
		names = step.names
		check(step.what, step.want)
	}
	// Deleted from the vectors themselves, not only hidden.
	if n := errs.DeletePartialMatch(prometheus.Labels{"peer": "id2"}); n != 0 {
		t.Errorf("the vector still held %d series of the forgotten peer", n)
	}
	for _, l := range []string{"consumer", "cluster"} {
		if n := third.DeletePartialMatch(prometheus.Labels{l: "id2"}); n != 0 {
			t.Errorf("the vector still held %d series of the forgotten peer as %s", n, l)
		}
	}
	// A collector still at work on the forgotten peer makes a series of
	// it again: deleted at the next scrape, and at every one after, until
	// the peer is back.
	third.WithLabelValues("id2", "id1").Inc()
	check("made again once forgotten", want{
		[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=stranger,reason=quota"},
		[]string{"cluster=stranger,consumer=id1,consumer_name=marseille"}})
	third.WithLabelValues("id2", "id1").Inc()
	check("made again twice", want{
		[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=stranger,reason=quota"},
		[]string{"cluster=stranger,consumer=id1,consumer_name=marseille"}})
	names = map[string]string{"id1": "marseille", "id2": "lyon"}
	errs.WithLabelValues("id2", "quota").Inc()
	check("back", want{
		[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=id2,peer_name=lyon,reason=quota", "peer=stranger,reason=quota"},
		[]string{"cluster=stranger,consumer=id1,consumer_name=marseille"}})
	check("back, scraped again", want{
		[]string{"peer=id1,peer_name=marseille,reason=quota", "peer=id2,peer_name=lyon,reason=quota", "peer=stranger,reason=quota"},
		[]string{"cluster=stranger,consumer=id1,consumer_name=marseille"}})
	// A peer back is no longer deleted; one gone for good is deleted for
	// goneScrapes scrapes, then no longer looked for.
	if _, ok := reg.gone["id2"]; ok {
		t.Errorf("id2 is back, and still among the forgotten")
	}
	names = map[string]string{"id1": "marseille"}
	for range goneScrapes - 1 {
		series(t, reg, "test_errors_total")
	}
	if _, ok := reg.gone["id2"]; !ok {
		t.Errorf("id2 forgotten %d scrapes ago: no longer deleted before its last scrape", goneScrapes-1)
	}
	series(t, reg, "test_errors_total")
	if len(reg.gone) != 0 {
		t.Errorf("forgotten peers still looked for after %d scrapes: %v", goneScrapes, reg.gone)
	}
	// A series naming its peer already is left as it is.
	phase := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_phase", Help: "h"}, []string{"peer", "peer_name"})
	reg.MustRegister(phase)
	phase.WithLabelValues("id1", "marseille").Set(1)
	if got, want := series(t, reg, "test_phase"), []string{"peer=id1,peer_name=marseille"}; !slices.Equal(got, want) {
		t.Errorf("a named series: %v, want %v", got, want)
	}
}

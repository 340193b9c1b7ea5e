package agent

import (
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// peerLabels are the labels that hold a peer's cluster ID, each with the
// label peerMetrics adds beside it for the name the peer announced (what
// `kubectl get peers` shows): peer, its collector's usual label; consumer
// and cluster where a series concerns two clusters, a consumer of this
// one and a third cluster it names (flotilla_hosted_endpoints_*).
var peerLabels = [...]struct{ id, name string }{
	{"peer", "peer_name"},
	{"consumer", "consumer_name"},
	{"cluster", "cluster_name"},
}

// NameLabels are the labels /metrics adds, by the label that holds the
// peer's ID beside which each is added: peer_name beside peer, and so on.
func NameLabels() map[string]string {
	m := make(map[string]string, len(peerLabels))
	for _, l := range peerLabels {
		m[l.id] = l.name
	}
	return m
}

// peerMetrics is the agent's registry as /metrics serves it: every label
// of peerLabels that holds a peer's ID gains the peer's name beside it
// (peer_name beside peer, ...), read from the peering engine when
// scraped, so that a renamed peer's series are replaced, not doubled; and
// the series of a peer the engine has forgotten, under any of those
// labels, are deleted from the vectors registered here. Collectors of any
// package stay unaware of names.
type peerMetrics struct {
	*prometheus.Registry

	mu sync.Mutex
	// names are the current peers' names by cluster ID; nil until the
	// engine runs (series pass unnamed).
	names func() map[string]string
	// known are the peers of the last scrape; gone those forgotten since
	// and not back, by how many more scrapes delete their series (a
	// collector may still make one just after the engine forgot the
	// peer); vecs the registered collectors that hold series per label
	// value.
	known map[string]bool
	gone  map[string]int
	vecs  []partialDeleter
}

// partialDeleter is a metric vector (CounterVec, GaugeVec, HistogramVec,
// ...): its series of a peer are deleted when the peer is forgotten.
type partialDeleter interface {
	DeletePartialMatch(prometheus.Labels) int
}

func newPeerMetrics(r *prometheus.Registry) *peerMetrics {
	return &peerMetrics{Registry: r, known: map[string]bool{}, gone: map[string]int{}}
}

// Register registers c, and keeps it when it is a vector.
func (p *peerMetrics) Register(c prometheus.Collector) error {
	if err := p.Registry.Register(c); err != nil {
		return err
	}
	if v, ok := c.(partialDeleter); ok {
		p.mu.Lock()
		p.vecs = append(p.vecs, v)
		p.mu.Unlock()
	}
	return nil
}

// MustRegister registers cs as Register does, panicking on an error as
// prometheus.Registry's does.
func (p *peerMetrics) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := p.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters c and forgets it.
func (p *peerMetrics) Unregister(c prometheus.Collector) bool {
	p.mu.Lock()
	p.vecs = slices.DeleteFunc(p.vecs, func(v partialDeleter) bool { return any(v) == any(c) })
	p.mu.Unlock()
	return p.Registry.Unregister(c)
}

// nameFrom sets where the peers' names come from: the peering engine's
// PeerNames.
func (p *peerMetrics) nameFrom(names func() map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.names = names
}

// Gather deletes the series of the peers forgotten since the last scrape,
// then gathers and names each peer's series.
func (p *peerMetrics) Gather() ([]*dto.MetricFamily, error) {
	names := p.current()
	families, err := p.Registry.Gather()
	if names == nil {
		return families, err
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			nameSeries(m, names)
		}
	}
	return families, err
}

// goneScrapes is how many scrapes delete a forgotten peer's series: an
// hour's at Prometheus's usual 30 s, and the set of peers forgotten
// stays bounded however many come and go.
const goneScrapes = 120

// current reads the peers' names and deletes the series of those gone
// since the last call, and of those gone before and not back; nil before
// the engine runs.
func (p *peerMetrics) current() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.names == nil {
		return nil
	}
	names := p.names()
	for id := range p.known {
		if _, ok := names[id]; !ok {
			p.gone[id] = goneScrapes
			delete(p.known, id)
		}
	}
	for id, left := range p.gone {
		if _, back := names[id]; back {
			delete(p.gone, id)
			continue
		}
		if p.gone[id] = left - 1; left <= 1 {
			delete(p.gone, id)
		}
		for _, v := range p.vecs {
			for _, l := range peerLabels {
				v.DeletePartialMatch(prometheus.Labels{l.id: id})
			}
		}
	}
	for id := range names {
		p.known[id] = true
	}
	return names
}

// nameSeries adds to m, beside each label of peerLabels that holds a
// known peer's ID, the peer's name, unless m has that name label of its
// own (flotilla_peer_phase has peer_name); the labels stay sorted by name
// as the registry gives them.
func nameSeries(m *dto.Metric, names map[string]string) {
	var ids [len(peerLabels)]string
	var named [len(peerLabels)]bool
	for _, l := range m.GetLabel() {
		for i, pl := range peerLabels {
			switch l.GetName() {
			case pl.id:
				ids[i] = l.GetValue()
			case pl.name:
				named[i] = true
			}
		}
	}
	added := false
	for i, pl := range peerLabels {
		if name := names[ids[i]]; ids[i] != "" && !named[i] && name != "" {
			m.Label = append(m.Label, &dto.LabelPair{Name: ptr(pl.name), Value: ptr(name)})
			added = true
		}
	}
	if added {
		slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	}
}

func ptr(s string) *string { return &s }

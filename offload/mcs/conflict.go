package mcs

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// Source is one cluster's export of a Service.
type Source struct {
	Cluster string
	Export  Export
}

// Resolution is what the exports of one Service across the clusterset
// agree on (KEP-1645): where they differ, the oldest export's property
// holds (creation time, then cluster ID), and every export in a conflict
// is told so, the oldest included. Ports are the exception the KEP
// makes: the Service has the union of every export's ports, a port that
// clashes with an older one's (the same name, or the same number and
// protocol, otherwise different) left out.
type Resolution struct {
	// Oldest is the export whose properties hold.
	Oldest                Source
	Type                  string
	Ports                 []Port
	SessionAffinity       string
	AffinityTimeout       int32
	InternalTrafficPolicy string
	TrafficDistribution   string
	// Labels and Annotations are the oldest export's exported ones.
	Labels, Annotations map[string]string
	// Conflicts are the clusters whose exports are in conflict, with the
	// KEP's reason for the first property that differs: every export
	// that differs from the oldest, and the oldest when any does.
	Conflicts []Conflict
}

// Conflict is one export in conflict.
type Conflict struct {
	Cluster string
	Reason  string
	Message string
}

// Resolve resolves sources, at least one.
func Resolve(sources []Source) Resolution {
	sorted := slices.Clone(sources)
	slices.SortFunc(sorted, func(a, b Source) int {
		if c := a.Export.Created.Compare(b.Export.Created); c != 0 {
			return c
		}
		return cmp.Compare(a.Cluster, b.Cluster)
	})
	o := sorted[0]
	r := Resolution{Oldest: o, Type: o.Export.Type, SessionAffinity: affinity(o.Export), AffinityTimeout: o.Export.AffinityTimeout,
		InternalTrafficPolicy: o.Export.InternalTrafficPolicy, TrafficDistribution: o.Export.TrafficDistribution,
		Labels: o.Export.Labels, Annotations: o.Export.Annotations}
	var ports []Port
	for _, s := range sorted {
		ports = unionPorts(ports, s.Export.Ports)
	}
	r.Ports = sortedPorts(ports)
	var first Conflict
	for _, s := range sorted[1:] {
		if reason, what := differs(o.Export, s.Export); reason != "" {
			c := Conflict{Cluster: s.Cluster, Reason: reason,
				Message: fmt.Sprintf("the export of cluster %s differs in %s from the oldest export, of cluster %s, which holds%s", s.Cluster, what, o.Cluster, portsNote(reason))}
			if first.Cluster == "" {
				first = c
			}
			r.Conflicts = append(r.Conflicts, c)
		}
	}
	if first.Cluster != "" {
		r.Conflicts = append(r.Conflicts, Conflict{Cluster: o.Cluster, Reason: first.Reason,
			Message: fmt.Sprintf("the oldest export, which holds; the export of cluster %s differs from it%s", first.Cluster, portsNote(first.Reason))})
	}
	return r
}

// portsNote says what a port conflict leaves the Service with.
func portsNote(reason string) string {
	if reason == string(mcsv1alpha1.ServiceExportReasonPortConflict) {
		return " (the Service has every export's ports but those clashing with an older export's)"
	}
	return ""
}

// unionPorts adds to have the ports of add that clash with none of it: a
// port of the same name, or of the same number and protocol, that is not
// the same port.
func unionPorts(have, add []Port) []Port {
	out := have
	for _, p := range add {
		if !slices.ContainsFunc(out, func(q Port) bool { return q == p || q.Name == p.Name || (q.Port == p.Port && q.Protocol == p.Protocol) }) {
			out = append(out, p)
		}
	}
	return out
}

// differs returns the KEP's reason for the first property in which e
// differs from the oldest export, and its name for a person.
func differs(oldest, e Export) (reason, what string) {
	switch {
	case oldest.Type != e.Type:
		return string(mcsv1alpha1.ServiceExportReasonTypeConflict), "type (" + e.Type + ", not " + oldest.Type + ")"
	case !slices.Equal(sortedPorts(oldest.Ports), sortedPorts(e.Ports)):
		return string(mcsv1alpha1.ServiceExportReasonPortConflict), "ports (" + portList(e.Ports) + ", not " + portList(oldest.Ports) + ")"
	case affinity(oldest) != affinity(e):
		return string(mcsv1alpha1.ServiceExportReasonSessionAffinityConflict), "session affinity (" + affinity(e) + ", not " + affinity(oldest) + ")"
	case oldest.AffinityTimeout != e.AffinityTimeout:
		return string(mcsv1alpha1.ServiceExportReasonSessionAffinityConfigConflict), "session affinity timeout"
	case !maps.Equal(oldest.Labels, e.Labels):
		return string(mcsv1alpha1.ServiceExportReasonLabelsConflict), "exported labels"
	case !maps.Equal(oldest.Annotations, e.Annotations):
		return string(mcsv1alpha1.ServiceExportReasonAnnotationsConflict), "exported annotations"
	}
	return "", ""
}

func affinity(e Export) string {
	if e.SessionAffinity == "" {
		return "None"
	}
	return e.SessionAffinity
}

func sortedPorts(ps []Port) []Port {
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b Port) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port),
			cmp.Compare(a.AppProtocol, b.AppProtocol))
	})
	return out
}

func portList(ps []Port) string {
	var b []string
	for _, p := range sortedPorts(ps) {
		b = append(b, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
	}
	return strings.Join(b, ",")
}

// ConflictOf returns cluster's conflict in r, if its export is in one.
func (r Resolution) ConflictOf(cluster string) (Conflict, bool) {
	for _, c := range r.Conflicts {
		if c.Cluster == cluster {
			return c, true
		}
	}
	return Conflict{}, false
}

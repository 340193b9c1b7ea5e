package mcs

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// The oldest export holds; every export that differs from it is in
// conflict, for the first property that differs, and so is the oldest
// (with the first conflict's reason); a tie in age goes to the lower
// cluster ID. Ports are the union of the exports', less those clashing
// with an older export's.
func TestResolve(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base := sampleExport("web", "front", 1)
	at := func(e Export, d time.Duration) Export { e.Created = t0.Add(d); return e }
	headless := base
	headless.Type = TypeHeadless
	otherPort := base
	otherPort.Ports = []Port{{Name: "http", Protocol: "TCP", Port: 8080}}
	sticky := base
	sticky.SessionAffinity = "ClientIP"
	reordered := base
	reordered.Ports = []Port{{Name: "b", Protocol: "UDP", Port: 53}, {Name: "a", Protocol: "TCP", Port: 53}}
	reordered2 := base
	reordered2.Ports = []Port{{Name: "a", Protocol: "TCP", Port: 53}, {Name: "b", Protocol: "UDP", Port: 53}}
	more := base
	more.Ports = append(slices.Clone(base.Ports), Port{Name: "stcp", Protocol: "SCTP", Port: 142})
	renumbered := base
	renumbered.Ports = []Port{{Name: "http", Protocol: "TCP", Port: 81}}
	renamed := base
	renamed.Ports = []Port{{Name: "web", Protocol: "TCP", Port: 80}}
	itp := base
	itp.InternalTrafficPolicy, itp.TrafficDistribution = "Local", "PreferClose"
	labelled := base
	labelled.Labels = map[string]string{"tier": "web"}
	annotated := base
	annotated.Annotations = map[string]string{"note": "hi"}

	for _, tt := range []struct {
		name      string
		sources   []Source
		oldest    string
		conflicts map[string]string
		ports     []Port // nil: the oldest's
	}{
		{"one", []Source{{"b", at(base, 0)}}, "b", nil, nil},
		{"agree", []Source{{"b", at(base, time.Hour)}, {"c", at(base, 0)}}, "c", nil, nil},
		{"type", []Source{{"b", at(base, 0)}, {"c", at(headless, time.Hour)}}, "b", map[string]string{"b": "TypeConflict", "c": "TypeConflict"}, nil},
		{"younger ports lose", []Source{{"b", at(otherPort, time.Hour)}, {"c", at(base, 0)}}, "c", map[string]string{"b": "PortConflict", "c": "PortConflict"}, nil},
		{"a port more joins the union", []Source{{"b", at(base, 0)}, {"c", at(more, time.Hour)}}, "b",
			map[string]string{"b": "PortConflict", "c": "PortConflict"}, more.Ports},
		{"a port renumbered clashes by name", []Source{{"b", at(base, 0)}, {"c", at(renumbered, time.Hour)}}, "b",
			map[string]string{"b": "PortConflict", "c": "PortConflict"}, nil},
		{"a port renamed clashes by number", []Source{{"b", at(base, 0)}, {"c", at(renamed, time.Hour)}}, "b",
			map[string]string{"b": "PortConflict", "c": "PortConflict"}, nil},
		{"affinity", []Source{{"b", at(base, 0)}, {"c", at(sticky, time.Hour)}}, "b", map[string]string{"b": "SessionAffinityConflict", "c": "SessionAffinityConflict"}, nil},
		{"exported labels", []Source{{"b", at(base, 0)}, {"c", at(labelled, time.Hour)}}, "b", map[string]string{"b": "LabelsConflict", "c": "LabelsConflict"}, nil},
		{"exported annotations", []Source{{"b", at(annotated, 0)}, {"c", at(base, time.Hour)}}, "b", map[string]string{"b": "AnnotationsConflict", "c": "AnnotationsConflict"}, nil},
		{"traffic policies are the oldest's, no conflict", []Source{{"b", at(itp, 0)}, {"c", at(base, time.Hour)}}, "b", nil, nil},
		{"tie goes to the lower ID", []Source{{"c", at(base, 0)}, {"b", at(headless, 0)}}, "b", map[string]string{"b": "TypeConflict", "c": "TypeConflict"}, nil},
		{"port order does not matter", []Source{{"b", at(reordered, 0)}, {"c", at(reordered2, time.Hour)}}, "b", nil, nil},
		{"three", []Source{{"a", at(sticky, 2*time.Hour)}, {"b", at(base, 0)}, {"c", at(headless, time.Hour)}}, "b",
			map[string]string{"a": "SessionAffinityConflict", "b": "TypeConflict", "c": "TypeConflict"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := Resolve(tt.sources)
			if r.Oldest.Cluster != tt.oldest {
				t.Errorf("oldest %s, want %s", r.Oldest.Cluster, tt.oldest)
			}
			if r.Type != r.Oldest.Export.Type || r.InternalTrafficPolicy != r.Oldest.Export.InternalTrafficPolicy ||
				r.TrafficDistribution != r.Oldest.Export.TrafficDistribution {
				t.Errorf("type %s, traffic policy %q, distribution %q: not the oldest's", r.Type, r.InternalTrafficPolicy, r.TrafficDistribution)
			}
			if !maps.Equal(r.Labels, r.Oldest.Export.Labels) || !maps.Equal(r.Annotations, r.Oldest.Export.Annotations) {
				t.Errorf("labels %v, annotations %v: not the oldest's", r.Labels, r.Annotations)
			}
			want := tt.ports
			if want == nil {
				want = r.Oldest.Export.Ports
			}
			if !slices.Equal(r.Ports, sortedPorts(want)) {
				t.Errorf("ports %v, want %v", r.Ports, sortedPorts(want))
			}
			got := map[string]string{}
			for _, c := range r.Conflicts {
				got[c.Cluster] = c.Reason
				if c.Message == "" {
					t.Errorf("conflict of %s says nothing", c.Cluster)
				}
			}
			if len(got) != len(tt.conflicts) {
				t.Fatalf("conflicts %v, want %v", got, tt.conflicts)
			}
			for c, reason := range tt.conflicts {
				if got[c] != reason {
					t.Errorf("conflict of %s: %q, want %q", c, got[c], reason)
				}
			}
		})
	}
}

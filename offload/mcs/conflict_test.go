package mcs

import (
	"testing"
	"time"
)

// The oldest export holds; every export that differs from it is in
// conflict, for the first property that differs; a tie in age goes to
// the lower cluster ID.
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

	for _, tt := range []struct {
		name      string
		sources   []Source
		oldest    string
		conflicts map[string]string
	}{
		{"one", []Source{{"b", at(base, 0)}}, "b", nil},
		{"agree", []Source{{"b", at(base, time.Hour)}, {"c", at(base, 0)}}, "c", nil},
		{"type", []Source{{"b", at(base, 0)}, {"c", at(headless, time.Hour)}}, "b", map[string]string{"c": "TypeConflict"}},
		{"younger ports lose", []Source{{"b", at(otherPort, time.Hour)}, {"c", at(base, 0)}}, "c", map[string]string{"b": "PortConflict"}},
		{"affinity", []Source{{"b", at(base, 0)}, {"c", at(sticky, time.Hour)}}, "b", map[string]string{"c": "SessionAffinityConflict"}},
		{"tie goes to the lower ID", []Source{{"c", at(base, 0)}, {"b", at(headless, 0)}}, "b", map[string]string{"c": "TypeConflict"}},
		{"port order does not matter", []Source{{"b", at(reordered, 0)}, {"c", at(reordered2, time.Hour)}}, "b", nil},
		{"three", []Source{{"a", at(sticky, 2*time.Hour)}, {"b", at(base, 0)}, {"c", at(headless, time.Hour)}}, "b",
			map[string]string{"a": "SessionAffinityConflict", "c": "TypeConflict"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := Resolve(tt.sources)
			if r.Oldest.Cluster != tt.oldest {
				t.Errorf("oldest %s, want %s", r.Oldest.Cluster, tt.oldest)
			}
			if r.Type != r.Oldest.Export.Type {
				t.Errorf("type %s, not the oldest's", r.Type)
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

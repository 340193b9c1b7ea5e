package mcs

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestExportedMeta(t *testing.T) {
	in := map[string]string{
		"tier":                         "web",
		"example.com/team":             "shop",
		"app.kubernetes.io/managed-by": "someone",  // Kubernetes' domain
		"topology.k8s.io/zone":         "a",        // Kubernetes' domain
		"mcs.flotilla.io/imported":     "x",        // ours
		"bad key!":                     "x",        // not a key
		"ok":                           "not ok!!", // not a label value
	}
	got := exportedMeta(in, true)
	want := map[string]string{"tier": "web", "example.com/team": "shop"}
	if !maps.Equal(got, want) {
		t.Errorf("labels: %v, want %v", got, want)
	}
	// An annotation's value may be anything.
	if got := exportedMeta(in, false); got["ok"] != "not ok!!" || len(got) != 3 {
		t.Errorf("annotations: %v", got)
	}
	if err := validExportedMeta(want, true); err != nil {
		t.Errorf("what the exporter sends is refused: %v", err)
	}
	for k, v := range in {
		if _, ok := want[k]; ok {
			continue
		}
		if err := validExportedMeta(map[string]string{k: v}, true); err == nil {
			t.Errorf("label %q=%q from a peer accepted", k, v)
		}
	}

	many := map[string]string{}
	for i := range MaxExportedEntries + 10 {
		many[fmt.Sprintf("k%03d", i)] = "v"
	}
	if got := exportedMeta(many, true); len(got) != MaxExportedEntries || got["k000"] != "v" {
		t.Errorf("%d labels kept of %d, want the first %d", len(got), len(many), MaxExportedEntries)
	}
	if err := validExportedMeta(many, true); err == nil {
		t.Errorf("%d labels from a peer accepted", len(many))
	}
	big := map[string]string{"a": strings.Repeat("x", MaxExportedAnnotationBytes), "b": "y"}
	if got := exportedMeta(big, false); len(got) != 1 || got["b"] != "y" {
		t.Errorf("annotations past the size bound: kept %d", len(got))
	}
	if err := validExportedMeta(big, false); err == nil {
		t.Error("annotations past the size bound from a peer accepted")
	}
}

func TestApplyExported(t *testing.T) {
	m := metav1.ObjectMeta{Labels: map[string]string{LabelManagedBy: ManagedBy, "user": "kept"}}
	if !applyExported(&m, map[string]string{"tier": "web"}, map[string]string{"note": "hi"}) {
		t.Fatal("no change reported")
	}
	if m.Labels["tier"] != "web" || m.Labels["user"] != "kept" || m.Labels[LabelManagedBy] != ManagedBy || m.Annotations["note"] != "hi" {
		t.Fatalf("after the first export: %v %v", m.Labels, m.Annotations)
	}
	if applyExported(&m, map[string]string{"tier": "web"}, map[string]string{"note": "hi"}) {
		t.Error("a change reported for the same export")
	}
	// The export changes its labels and drops its annotations: what it
	// no longer carries goes, what another wrote stays.
	m.Annotations["user-note"] = "kept"
	applyExported(&m, map[string]string{"tier2": "api"}, nil)
	if _, ok := m.Labels["tier"]; ok || m.Labels["tier2"] != "api" || m.Labels["user"] != "kept" {
		t.Errorf("labels %v", m.Labels)
	}
	if _, ok := m.Annotations["note"]; ok || m.Annotations["user-note"] != "kept" || m.Annotations[AnnotationImportedAnnotations] != "" {
		t.Errorf("annotations %v", m.Annotations)
	}
	applyExported(&m, nil, nil)
	if want := map[string]string{LabelManagedBy: ManagedBy, "user": "kept"}; !maps.Equal(m.Labels, want) {
		t.Errorf("labels after the export carries none: %v, want %v", m.Labels, want)
	}
	if want := map[string]string{"user-note": "kept"}; !maps.Equal(m.Annotations, want) {
		t.Errorf("annotations after the export carries none: %v, want %v", m.Annotations, want)
	}
}

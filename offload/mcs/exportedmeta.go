package mcs

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// A ServiceExport's exportedLabels and exportedAnnotations (KEP-1645,
// "Labels and annotations") travel with its export and land on every
// importer's ServiceImport, the oldest export's where they differ. What an
// importer writes into its own API server is bounded and kept off the
// names Kubernetes and Flotilla act on:
const (
	// MaxExportedEntries bounds each map.
	MaxExportedEntries = 64
	// MaxExportedAnnotationBytes bounds the annotations' keys and values
	// together.
	MaxExportedAnnotationBytes = 16 << 10
)

// Annotations on a ServiceImport naming the keys the importer copied
// from the exports, so it removes exactly those when an export stops
// carrying them; keys anyone else set stay.
const (
	AnnotationImportedLabels      = "mcs.flotilla.io/imported-labels"
	AnnotationImportedAnnotations = "mcs.flotilla.io/imported-annotations"
)

// reservedKey says whether key is in a domain an importer's controllers
// act on: Kubernetes' (kubernetes.io, k8s.io) and ours (flotilla.io),
// subdomains included. A peer may not set those on our objects.
func reservedKey(key string) bool {
	prefix, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	for _, d := range []string{"kubernetes.io", "k8s.io", "flotilla.io"} {
		if prefix == d || strings.HasSuffix(prefix, "."+d) {
			return true
		}
	}
	return false
}

// exportedMeta is what of a ServiceExport's exportedLabels (labels true)
// or exportedAnnotations the exporter sends: valid keys (and label
// values) outside the reserved domains, in key order, within the bounds.
// The rest is left out, as docs/services.md says.
func exportedMeta(m map[string]string, labels bool) map[string]string {
	var out map[string]string
	size := 0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if checkEntry(k, v, labels) != nil || len(out) == MaxExportedEntries ||
			(!labels && size+len(k)+len(v) > MaxExportedAnnotationBytes) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
		size += len(k) + len(v)
	}
	return out
}

// checkEntry is nil when key and value may be exported as a label
// (labels true) or an annotation.
func checkEntry(key, value string, labels bool) error {
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return fmt.Errorf("key %q: %s", key, errs[0])
	}
	if reservedKey(key) {
		return fmt.Errorf("key %q: in a reserved domain (kubernetes.io, k8s.io, flotilla.io)", key)
	}
	if labels {
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return fmt.Errorf("label %q: value: %s", key, errs[0])
		}
	}
	return nil
}

// validExportedMeta checks what a peer sent as an export's labels or
// annotations: what exportedMeta would have let through, nothing more.
func validExportedMeta(m map[string]string, labels bool) error {
	what := "annotations"
	if labels {
		what = "labels"
	}
	if len(m) > MaxExportedEntries {
		return fmt.Errorf("%d exported %s, at most %d", len(m), what, MaxExportedEntries)
	}
	size := 0
	for k, v := range m {
		if err := checkEntry(k, v, labels); err != nil {
			return fmt.Errorf("exported %s: %w", what, err)
		}
		size += len(k) + len(v)
	}
	if !labels && size > MaxExportedAnnotationBytes {
		return fmt.Errorf("exported annotations of %d bytes, at most %d", size, MaxExportedAnnotationBytes)
	}
	return nil
}

// applyExported puts labels and annotations, the resolved exports', on a
// ServiceImport's metadata, taking off those it copied before and no
// export carries now; it reports whether m changed.
func applyExported(m *metav1.ObjectMeta, labels, annotations map[string]string) bool {
	before := m.DeepCopy()
	ann := maps.Clone(m.Annotations)
	m.Labels = withExported(m.Labels, ann[AnnotationImportedLabels], labels)
	ann = withExported(ann, ann[AnnotationImportedAnnotations], annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	recordKeys(ann, AnnotationImportedLabels, labels)
	recordKeys(ann, AnnotationImportedAnnotations, annotations)
	if len(ann) == 0 {
		ann = nil
	}
	m.Annotations = ann
	return !maps.Equal(before.Labels, m.Labels) || !maps.Equal(before.Annotations, m.Annotations)
}

// withExported is m without the keys listed in had (comma-separated) and
// with want; nil when empty.
func withExported(m map[string]string, had string, want map[string]string) map[string]string {
	out := maps.Clone(m)
	for _, k := range strings.Split(had, ",") {
		delete(out, k)
	}
	if len(want) > 0 && out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, want)
	if len(out) == 0 {
		return nil
	}
	return out
}

// recordKeys notes want's keys in ann[record], or removes the note when
// there are none.
func recordKeys(ann map[string]string, record string, want map[string]string) {
	if len(want) == 0 {
		delete(ann, record)
		return
	}
	ann[record] = strings.Join(slices.Sorted(maps.Keys(want)), ",")
}

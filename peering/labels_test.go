package peering

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Labels are Kubernetes label keys and values; flotilla's own domain is
// refused. A Hello with bad labels is neither sealed nor read.
func TestClusterLabels(t *testing.T) {
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[fmt.Sprintf("l%d", i)] = "v"
	}
	large := map[string]string{}
	for i := range 33 { // 33 of 126 bytes
		large[fmt.Sprintf("%s%02d", strings.Repeat("k", 61), i)] = strings.Repeat("v", 63)
	}
	tests := []struct {
		name   string
		labels map[string]string
		says   string // the error says this; empty: valid
	}{
		{"none", nil, ""},
		{"name and value", map[string]string{"region": "eu-west-1"}, ""},
		{"prefixed", map[string]string{"topology.example.com/zone": "a"}, ""},
		{"empty value", map[string]string{"gpu": ""}, ""},
		{"longest name and value", map[string]string{strings.Repeat("k", 63): strings.Repeat("v", 63)}, ""},
		{"longest prefix", map[string]string{strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61) + "/k": "v"}, ""},
		{"kubernetes.io prefix", map[string]string{"topology.kubernetes.io/region": "a"}, ""},
		{"mixed case, dots, underscores", map[string]string{"Tier_1.x": "Gold_2.b"}, ""},
		{"exactly the limit", func() map[string]string { m := maps.Clone(many); delete(m, "l0"); return m }(), ""},
		{"too many", many, "65 labels, over 64"},
		{"too many bytes", large, "labels of 4158 bytes (keys and values), over 4096"},
		{"empty key", map[string]string{"": "v"}, "empty"},
		{"name too long", map[string]string{strings.Repeat("k", 64): "v"}, "64 characters, over 63"},
		{"value too long", map[string]string{"k": strings.Repeat("v", 64)}, "64 characters, over 63"},
		{"name starts with a dash", map[string]string{"-k": "v"}, "starting and ending"},
		{"value ends with a dot", map[string]string{"k": "v."}, "starting and ending"},
		{"space in value", map[string]string{"k": "a b"}, "letters, digits"},
		{"non-ASCII", map[string]string{"région": "a"}, "letters, digits"},
		{"empty prefix", map[string]string{"/k": "v"}, "prefix \"\": empty"},
		{"empty name", map[string]string{"example.com/": "v"}, "name \"\": empty"},
		{"two slashes", map[string]string{"a/b/c": "v"}, "letters, digits"},
		{"upper-case prefix", map[string]string{"Example.com/k": "v"}, "DNS subdomain"},
		{"prefix too long", map[string]string{strings.Repeat("a.", 127) + "b/k": "v"}, "255 characters, over 253"},
		{"flotilla.io", map[string]string{"flotilla.io/tenant": "x"}, "flotilla's own"},
		{"a subdomain of flotilla.io", map[string]string{"offload.flotilla.io/x": "y"}, "flotilla's own"},
		{"flotilla.io without a prefix", map[string]string{"flotilla.io": "y"}, ""},
		{"a domain ending like ours", map[string]string{"notflotilla.io/x": "y"}, ""},
	}
	a, b := mustIdentity(t), mustIdentity(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckLabels(tt.labels)
			switch {
			case tt.says == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.says != "" && (err == nil || !strings.Contains(err.Error(), tt.says)):
				t.Fatalf("CheckLabels: %v, want an error saying %q", err, tt.says)
			}
			h := sampleHello(a, b)
			h.Labels = tt.labels
			_, sealErr := Seal(h, a)
			// What a sender that does not check would send.
			_, parseErr := Parse(reseal(withFields(t, sampleHello(a, b), map[string]any{"labels": tt.labels}), a))
			if tt.says == "" {
				if sealErr != nil || parseErr != nil {
					t.Fatalf("Seal: %v; Parse: %v", sealErr, parseErr)
				}
				return
			}
			if sealErr == nil {
				t.Error("Seal accepted the labels")
			}
			if !errors.Is(parseErr, ErrMalformed) {
				t.Errorf("Parse: %v, want %v", parseErr, ErrMalformed)
			}
		})
	}
}

// A peer's labels reach its state, and follow its statements: a label it
// no longer announces goes, a changed value follows.
func TestLabelsReachPeerState(t *testing.T) {
	net := &network{}
	a := newNode(t, net, nodeOptions{labels: map[string]string{"region": "a", "zone": "a1"}})
	b := newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "b has a's labels", func() error {
		if got := stateOf(b, a).Labels; !maps.Equal(got, map[string]string{"region": "a", "zone": "a1"}) {
			return fmt.Errorf("labels %v", got)
		}
		return nil
	})
	if got := stateOf(a, b).Labels; len(got) != 0 {
		t.Errorf("a's state of b, which announces none, has labels %v", got)
	}

	a.stop()
	net.mu.Lock()
	delete(net.engines, a.id.ClusterID())
	net.mu.Unlock()
	a2 := newNode(t, net, nodeOptions{seed: a, labels: map[string]string{"region": "b"}})
	meet(a2, b)
	within(t, "b has a's new labels", func() error {
		if got := stateOf(b, a2).Labels; !maps.Equal(got, map[string]string{"region": "b"}) {
			return fmt.Errorf("labels %v", got)
		}
		return nil
	})
}

// A statement that claims a label under flotilla.io/ is refused as
// malformed, and nothing of it reaches the peer's state.
func TestReservedLabelIsRefused(t *testing.T) {
	net := &network{}
	a, b := newNode(t, net, nodeOptions{labels: map[string]string{"region": "a"}}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "connected", func() error { return connected(a, b) })
	before := stateOf(b, a)

	h := sampleHello(a.id, b.id)
	h.Generation = 1 << 62 // newer than anything a issued
	bad := withFields(t, h, map[string]any{"labels": map[string]string{"region": "a", "flotilla.io/tenant": "c" + strings.Repeat("a", 26)}})
	refused := testutil.ToFloat64(b.eng.metrics.refused.WithLabelValues("malformed"))
	b.eng.Receive(reseal(bad, a.id))
	within(t, "refused as malformed", func() error {
		if v := testutil.ToFloat64(b.eng.metrics.refused.WithLabelValues("malformed")); v != refused+1 {
			return fmt.Errorf("malformed refusals %v, were %v", v, refused)
		}
		return nil
	})
	after := stateOf(b, a)
	if after.StatementGeneration != before.StatementGeneration || !maps.Equal(after.Labels, map[string]string{"region": "a"}) {
		t.Fatalf("after the refusal: generation %d (was %d), labels %v", after.StatementGeneration, before.StatementGeneration, after.Labels)
	}
}

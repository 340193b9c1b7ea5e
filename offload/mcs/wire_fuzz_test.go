package mcs

import (
	"testing"
)

// FuzzDecodeExports feeds the decoder what another cluster could write:
// it returns a page or an error, never panics, and a page it returns
// passes validation.
func FuzzDecodeExports(f *testing.F) {
	b := mustIdentity(f)
	keys := keysOf(b)
	for _, s := range []Snapshot{
		{Cluster: b.ClusterID(), Serial: 1},
		{Cluster: b.ClusterID(), Serial: 2, Exports: []Export{sampleExport("web", "front", 3)}},
	} {
		msgs, err := Encode(b, s, 64<<10)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(msgs[0])
	}
	f.Add([]byte{1, '{', '}'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		p, err := DecodePage(msg, keys)
		if err != nil {
			return
		}
		if err := (page{Cluster: p.Cluster, Serial: p.Serial, Page: p.Page, Pages: p.Pages, Exports: p.Exports}).validate(); err != nil {
			t.Fatalf("accepted a page that does not validate: %v", err)
		}
		_, _, _ = NewInbox().Add(p)
	})
}

// FuzzDecodeExportsSigned signs whatever page JSON the fuzzer makes, so
// that the checks behind the signature are reached too.
func FuzzDecodeExportsSigned(f *testing.F) {
	b := mustIdentity(f)
	keys := keysOf(b)
	f.Add([]byte(`{"cluster":"` + b.ClusterID() + `","serial":1,"page":0,"pages":1,"exports":[]}`))
	f.Add([]byte(`{"cluster":"` + b.ClusterID() + `","serial":3,"page":0,"pages":2,"exports":[{"namespace":"web","name":"a","type":"Headless","created":"2026-01-01T00:00:00Z","slices":[{"endpoints":[{"addresses":["10.0.0.1"]}]}]}]}`))
	f.Add([]byte(`{"cluster":"` + b.ClusterID() + `","serial":4,"page":0,"pages":1,"exports":[{"namespace":"web","name":"a","type":"ClusterSetIP","created":"2026-01-01T00:00:00Z","internalTrafficPolicy":"Local","trafficDistribution":"PreferClose"}]}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		msg := append([]byte{wireFormat}, payload...)
		msg = append(msg, b.Sign(signed(msg))...)
		p, err := DecodePage(msg, keys)
		if err != nil {
			return
		}
		in := NewInbox()
		if _, _, err := in.Add(p); err != nil {
			t.Fatalf("a verified first page is refused: %v", err)
		}
	})
}

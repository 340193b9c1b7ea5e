package mcs

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/identity"
)

func mustIdentity(tb testing.TB) identity.Identity {
	tb.Helper()
	id, err := identity.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// keysOf looks up the keys of the given identities, as the agent looks up
// members.
func keysOf(ids ...identity.Identity) func(string) (ed25519.PublicKey, bool) {
	return func(c string) (ed25519.PublicKey, bool) {
		for _, id := range ids {
			if id.ClusterID() == c {
				return id.Public(), true
			}
		}
		return nil, false
	}
}

func sampleExport(ns, name string, endpoints int) Export {
	e := Export{Namespace: ns, Name: name, Type: TypeClusterSetIP,
		Ports:   []Port{{Name: "http", Protocol: "TCP", Port: 80}},
		Created: time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC), SessionAffinity: "None"}
	s := Slice{Ports: []Port{{Name: "http", Protocol: "TCP", Port: 8080}}}
	for i := range endpoints {
		s.Endpoints = append(s.Endpoints, Endpoint{
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})}, Ready: true, Serving: true})
	}
	e.Slices = []Slice{s}
	return e
}

// receive decodes and assembles msgs as an importer does.
func receive(t *testing.T, in *Inbox, keys func(string) (ed25519.PublicKey, bool), msgs [][]byte) (Snapshot, bool, error) {
	t.Helper()
	var snap Snapshot
	var done bool
	for _, m := range msgs {
		p, err := DecodePage(m, keys)
		if err != nil {
			return Snapshot{}, false, err
		}
		s, ok, err := in.Add(p)
		if err != nil {
			return Snapshot{}, false, err
		}
		if ok {
			snap, done = s, true
		}
	}
	return snap, done, nil
}

// A snapshot arrives as it was sent, in one page or many, the large
// export split by its endpoints and joined again.
func TestSnapshotRoundTrip(t *testing.T) {
	b := mustIdentity(t)
	for _, tt := range []struct {
		name      string
		exports   []Export
		wantPages int
	}{
		{"no exports", nil, 1},
		{"one small", []Export{sampleExport("web", "front", 3)}, 1},
		{"many small", func() (es []Export) {
			for i := range 400 {
				es = append(es, sampleExport("web", fmt.Sprintf("svc%d", i), 20))
			}
			return es
		}(), 0},
		{"one large", []Export{sampleExport("web", "big", 3000)}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := Snapshot{Cluster: b.ClusterID(), Serial: 7, Exports: tt.exports}
			msgs, err := Encode(b, s, 64<<10)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantPages > 0 && len(msgs) != tt.wantPages {
				t.Errorf("%d pages, want %d", len(msgs), tt.wantPages)
			}
			if tt.wantPages == 0 && len(msgs) < 2 {
				t.Errorf("%d pages, want it split", len(msgs))
			}
			for i, m := range msgs {
				if len(m) > 64<<10 {
					t.Errorf("page %d: %d bytes", i, len(m))
				}
			}
			// Pages arrive in any order.
			for i, j := 0, len(msgs)-1; i < j; i, j = i+1, j-1 {
				msgs[i], msgs[j] = msgs[j], msgs[i]
			}
			got, ok, err := receive(t, NewInbox(), keysOf(b), msgs)
			if err != nil || !ok {
				t.Fatalf("receive: ok=%v err=%v", ok, err)
			}
			if got.Cluster != s.Cluster || got.Serial != s.Serial || len(got.Exports) != len(s.Exports) {
				t.Fatalf("got %s serial %d with %d exports", got.Cluster, got.Serial, len(got.Exports))
			}
			byKey := map[string]Export{}
			for _, e := range got.Exports {
				byKey[e.Key()] = e
			}
			for _, want := range s.Exports {
				e := byKey[want.Key()]
				var gotEps, wantEps []Endpoint
				for _, sl := range e.Slices {
					gotEps = append(gotEps, sl.Endpoints...)
				}
				for _, sl := range want.Slices {
					wantEps = append(wantEps, sl.Endpoints...)
				}
				if len(gotEps) != len(wantEps) {
					t.Fatalf("%s: %d endpoints, want %d", want.Key(), len(gotEps), len(wantEps))
				}
				seen := map[netip.Addr]bool{}
				for _, ep := range gotEps {
					seen[ep.Addresses[0]] = true
				}
				for _, ep := range wantEps {
					if !seen[ep.Addresses[0]] {
						t.Fatalf("%s: endpoint %s lost", want.Key(), ep.Addresses[0])
					}
				}
				e.Slices, want.Slices = nil, nil
				if !reflect.DeepEqual(e, want) {
					t.Errorf("%s: got %+v, want %+v", want.Key(), e, want)
				}
			}
		})
	}
}

// What a receiver refuses: a forged or altered snapshot, one claiming
// another cluster, a stranger's, a replay, and nonsense.
func TestSnapshotRefusals(t *testing.T) {
	b, c, x := mustIdentity(t), mustIdentity(t), mustIdentity(t)
	keys := keysOf(b, c)
	good := func(serial uint64) []byte {
		msgs, err := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: serial, Exports: []Export{sampleExport("web", "front", 2)}}, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		return msgs[0]
	}
	tampered := good(5)
	tampered[len(tampered)-1] ^= 1
	claimsC, _ := Encode(b, Snapshot{Cluster: c.ClusterID(), Serial: 5}, 64<<10)
	stranger, _ := Encode(x, Snapshot{Cluster: x.ClusterID(), Serial: 5}, 64<<10)
	bad := sampleExport("web", "front", 1)
	bad.Type = "LoadBalancer"
	invalid, _ := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: 5, Exports: []Export{bad}}, 64<<10)
	badPolicy := sampleExport("web", "front", 1)
	badPolicy.InternalTrafficPolicy = "Everywhere"
	invalidPolicy, _ := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: 5, Exports: []Export{badPolicy}}, 64<<10)
	badDistribution := sampleExport("web", "front", 1)
	badDistribution.TrafficDistribution = "Prefer Close;drop"
	invalidDistribution, _ := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: 5, Exports: []Export{badDistribution}}, 64<<10)
	reservedLabel := sampleExport("web", "front", 1)
	reservedLabel.Labels = map[string]string{"app.kubernetes.io/managed-by": "mcs.flotilla.io"}
	invalidReservedLabel, _ := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: 5, Exports: []Export{reservedLabel}}, 64<<10)
	badAnnotation := sampleExport("web", "front", 1)
	badAnnotation.Annotations = map[string]string{"not a key": "x"}
	invalidAnnotation, _ := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: 5, Exports: []Export{badAnnotation}}, 64<<10)
	for _, tt := range []struct {
		name string
		msg  []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"a label in a reserved domain", invalidReservedLabel[0], ErrMalformed},
		{"an annotation that is not a key", invalidAnnotation[0], ErrMalformed},
		{"other format", append([]byte{9}, good(5)[1:]...), ErrMalformed},
		{"tampered", tampered, identity.ErrBadSignature},
		{"signed by another than it claims", claimsC[0], identity.ErrBadSignature},
		{"not a member", stranger[0], ErrUnknown},
		{"invalid export", invalid[0], ErrMalformed},
		{"invalid internal traffic policy", invalidPolicy[0], ErrMalformed},
		{"invalid traffic distribution", invalidDistribution[0], ErrMalformed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodePage(tt.msg, keys); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}

	t.Run("replay", func(t *testing.T) {
		in := NewInbox()
		if _, ok, err := receive(t, in, keys, [][]byte{good(6)}); !ok || err != nil {
			t.Fatalf("serial 6: ok=%v err=%v", ok, err)
		}
		for _, serial := range []uint64{6, 5} {
			if _, _, err := receive(t, in, keys, [][]byte{good(serial)}); !errors.Is(err, ErrReplay) {
				t.Errorf("serial %d after 6: err = %v, want a replay", serial, err)
			}
		}
		if _, ok, err := receive(t, in, keys, [][]byte{good(7)}); !ok || err != nil {
			t.Fatalf("serial 7: ok=%v err=%v", ok, err)
		}
	})
}

// A newer snapshot started while an older one is incomplete replaces it;
// the older one's late pages are refused.
func TestInboxNewerSerialWins(t *testing.T) {
	b := mustIdentity(t)
	big := []Export{sampleExport("web", "big", 3000)}
	old, err := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: 1, Exports: big}, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := Encode(b, Snapshot{Cluster: b.ClusterID(), Serial: 2, Exports: big[:0]}, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	in := NewInbox()
	if _, ok, err := receive(t, in, keysOf(b), old[:1]); ok || err != nil {
		t.Fatalf("first page of 1: ok=%v err=%v", ok, err)
	}
	got, ok, err := receive(t, in, keysOf(b), newer)
	if !ok || err != nil || got.Serial != 2 || len(got.Exports) != 0 {
		t.Fatalf("serial 2: %+v ok=%v err=%v", got, ok, err)
	}
	if _, _, err := receive(t, in, keysOf(b), old[1:2]); !errors.Is(err, ErrReplay) {
		t.Fatalf("late page of 1: err = %v, want a replay", err)
	}
}

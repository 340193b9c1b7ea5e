package ipam

import (
	"crypto/sha256"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/flotilla-io/flotilla/identity"
)

const benchPeers = 1000

// benchPeerIDs are real-looking cluster IDs.
func benchPeerIDs() []string {
	ids := make([]string, benchPeers)
	for i := range ids {
		pub := sha256.Sum256([]byte{byte(i), byte(i >> 8)})
		ids[i] = identity.ClusterID(pub[:])
	}
	return ids
}

// Every benchmark peer is dual-stack and uses the same ranges as we do, so
// every view is remapped: the allocator's worst case.
var benchRanges = []netip.Prefix{pfx("10.0.0.0/22"), pfx("fd00:10::/56")}

func benchLedger(b *testing.B, noSync bool) *Ledger {
	b.Helper()
	l, err := Open(filepath.Join(b.TempDir(), FileName), Options{noSync: noSync})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := l.SetLocalNetworks([]LocalNetwork{
		{Range: pfx("10.0.0.0/16"), Kind: PodNetwork},
		{Range: pfx("10.96.0.0/12"), Kind: ServiceNetwork},
		{Range: pfx("fd00:10::/56"), Kind: PodNetwork},
	}); err != nil {
		b.Fatal(err)
	}
	return l
}

func reportLedger(b *testing.B, l *Ledger) {
	if got := len(l.Views("")); got != benchPeers*len(benchRanges) {
		b.Fatalf("%d views, want %d", got, benchPeers*len(benchRanges))
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/1000peers")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*benchPeers)/1000, "ms/peer")
	fi, err := os.Stat(l.Path())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(fi.Size())/1024, "KiB-ledger")
}

// BenchmarkViews1000OneByOne maps 1000 peers, one transaction (and fsync)
// per peer, as the agent does when peers arrive one at a time. "nosync"
// shows the share of the disk.
func BenchmarkViews1000OneByOne(b *testing.B) {
	for _, mode := range []struct {
		name   string
		noSync bool
	}{{"fsync", false}, {"nosync", true}} {
		b.Run(mode.name, func(b *testing.B) {
			ids := benchPeerIDs()
			var l *Ledger
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if l != nil {
					l.Close()
				}
				l = benchLedger(b, mode.noSync)
				b.StartTimer()
				for _, id := range ids {
					if _, err := l.SyncPeer(id, benchRanges); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			reportLedger(b, l)
			l.Close()
		})
	}
}

// BenchmarkViews1000Batch maps the same 1000 peers in one transaction.
func BenchmarkViews1000Batch(b *testing.B) {
	ids := benchPeerIDs()
	var reqs []ViewRequest
	for _, id := range ids {
		for _, r := range benchRanges {
			reqs = append(reqs, ViewRequest{Peer: id, Remote: r})
		}
	}
	var l *Ledger
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if l != nil {
			l.Close()
		}
		l = benchLedger(b, false)
		b.StartTimer()
		if _, err := l.ViewsOf(reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportLedger(b, l)
	l.Close()
}

// BenchmarkFsyncBaseline is the floor under every commit on this disk: one
// page written and fdatasynced. A bbolt commit syncs twice.
func BenchmarkFsyncBaseline(b *testing.B) {
	f, err := os.CreateTemp(b.TempDir(), "sync")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	for i := 0; i < b.N; i++ {
		if _, err := f.WriteAt(page, int64(i%16)*4096); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkToLocal translates pod addresses of 1000 remapped peers.
func BenchmarkToLocal(b *testing.B) {
	ids := benchPeerIDs()
	l := benchLedger(b, true)
	defer l.Close()
	var reqs []ViewRequest
	for _, id := range ids {
		reqs = append(reqs, ViewRequest{Peer: id, Remote: benchRanges[0]}, ViewRequest{Peer: id, Remote: benchRanges[1]})
	}
	if _, err := l.ViewsOf(reqs); err != nil {
		b.Fatal(err)
	}
	ips := []netip.Addr{netip.MustParseAddr("10.0.2.7"), netip.MustParseAddr("fd00:10:0:12::7")}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := l.ToLocal(ids[i%benchPeers], ips[i&1]); !ok {
			b.Fatal("no translation")
		}
	}
}

// BenchmarkToRemote is the reverse translation.
func BenchmarkToRemote(b *testing.B) {
	ids := benchPeerIDs()
	l := benchLedger(b, true)
	defer l.Close()
	views := make([]netip.Addr, benchPeers)
	for i, id := range ids {
		v, err := l.ViewOf(id, benchRanges[0])
		if err != nil {
			b.Fatal(err)
		}
		views[i] = v.Addr().Next()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := l.ToRemote(ids[i%benchPeers], views[i%benchPeers]); !ok {
			b.Fatal("no translation")
		}
	}
}

// What a negotiation that settled pays each time it records a claim it
// already recorded (peering does so on every reconcile).
func BenchmarkRecordTheirViewUnchanged(b *testing.B) {
	dir := b.TempDir()
	l, err := Open(filepath.Join(dir, FileName), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	mine, theirs := netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("100.96.0.0/16")
	if _, err := l.SetLocalNetworks([]LocalNetwork{{Range: mine, Kind: PodNetwork}}); err != nil {
		b.Fatal(err)
	}
	if err := l.RecordTheirView("cpeer", mine, theirs); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := l.RecordTheirView("cpeer", mine, theirs); err != nil {
			b.Fatal(err)
		}
	}
}

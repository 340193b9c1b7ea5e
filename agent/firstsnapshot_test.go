package agent

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
)

// stateAgent is an agent with ledger snapshots on, against cp, for its
// openState alone; its log goes to log.
func stateAgent(t *testing.T, kubeconfig string, log *syncLog) *Agent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.StateDir, cfg.MetricsAddr = kubeconfig, t.TempDir(), "127.0.0.1:0"
	cfg.Namespace, cfg.LedgerSnapshots = "flotilla-system", true
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// openStateOf runs a's openState as its start does (the snapshot read
// beside it) and stops what it started at the end of the test.
func openStateOf(t *testing.T, a *Agent) state {
	t.Helper()
	comps := newComponents(a.log, func(err error) { t.Errorf("component failed: %v", err) })
	t.Cleanup(func() {
		if err := comps.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	snap := startBackground(t.Context(), a.newestLedgerSnapshot)
	defer snap.stop()
	st, err := a.openState(t.Context(), comps, snap)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// snapshotIdentity is the cluster ID the snapshot Secret records.
func snapshotIdentity(t *testing.T, snaps *ha.Snapshots) string {
	t.Helper()
	snap, err := snaps.Newest(t.Context())
	if err != nil || snap == nil {
		t.Fatalf("no snapshot: %v", err)
	}
	l, err := ipam.Open(filepath.Join(t.TempDir(), ipam.FileName), ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Restore(snap, keyIdentity); err != nil {
		t.Fatal(err)
	}
	id, err := loadIdentity(l)
	if err != nil {
		t.Fatal(err)
	}
	return id.ClusterID()
}

// A replica that makes the cluster's identity records it in the snapshot
// Secret before its start goes on: the Secret names it as soon as
// openState returns, not a debounce later, so a replica taking over
// right after finds it instead of making another.
func TestFirstSnapshotIsWrittenBeforeTheIdentityIsUsed(t *testing.T) {
	cp, _ := electionPlane(t)
	first := stateAgent(t, cp.Kubeconfig, &syncLog{})
	snaps := first.ledgerSnapshots()
	st := openStateOf(t, first)
	if got, want := snapshotIdentity(t, snaps), st.id.ClusterID(); got != want {
		t.Fatalf("the snapshot right after the start records cluster %s, the new identity is %s", got, want)
	}
	if st.ledger.Replicated() != st.ledger.Generation() {
		t.Fatalf("ledger at generation %d, replicated %d", st.ledger.Generation(), st.ledger.Replicated())
	}

	// A second replica whose ledger made an identity of its own before
	// the Secret was written (two replicas starting at install) yields to
	// the recorded one at its first snapshot, and keeps its own aside.
	t.Run("a new identity yields to the one recorded first", func(t *testing.T) {
		log := &syncLog{}
		second := stateAgent(t, cp.Kubeconfig, log)
		ledger, err := ipam.Open(filepath.Join(second.cfg.StateDir, ipam.FileName), ipam.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer ledger.Close()
		own, err := loadIdentity(ledger)
		if err != nil {
			t.Fatal(err)
		}
		id, err := second.firstSnapshot(t.Context(), snaps, ledger, own)
		if err != nil {
			t.Fatal(err)
		}
		if id.ClusterID() != st.id.ClusterID() || id.ClusterID() == own.ClusterID() {
			t.Fatalf("identity after the first snapshot %s; recorded %s, its own %s", id.ClusterID(), st.id.ClusterID(), own.ClusterID())
		}
		if stored, err := loadIdentity(ledger); err != nil || stored.ClusterID() != st.id.ClusterID() {
			t.Fatalf("the ledger holds identity %v (%v), want %s", stored.ClusterID(), err, st.id.ClusterID())
		}
		if got := snapshotIdentity(t, snaps); got != st.id.ClusterID() {
			t.Fatalf("the Secret now records %s, want the first replica's %s", got, st.id.ClusterID())
		}
		aside, err := filepath.Glob(filepath.Join(second.cfg.StateDir, ipam.FileName+".superseded-*"))
		if err != nil || len(aside) != 1 {
			t.Fatalf("ledgers kept aside: %v (%v); want one; log:\n%s", aside, err, log)
		}
		kept := keptIdentity(t, aside[0])
		if kept != own.ClusterID() {
			t.Fatalf("the ledger kept aside holds %s, want the second replica's own %s", kept, own.ClusterID())
		}
		if !strings.Contains(log.String(), "yields to it") {
			t.Errorf("no warning of the yield; log:\n%s", log)
		}
	})

	// A ledger already replicated writes nothing at the start: the
	// snapshots' writer keeps it current.
	t.Run("a replicated ledger is left to the writer", func(t *testing.T) {
		secrets := cp.Client.CoreV1().Secrets("flotilla-system")
		before, err := secrets.Get(t.Context(), ha.SecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		id, err := first.firstSnapshot(t.Context(), snaps, st.ledger, st.id)
		if err != nil || id.ClusterID() != st.id.ClusterID() {
			t.Fatalf("firstSnapshot on a replicated ledger = %v, %v", id.ClusterID(), err)
		}
		after, err := secrets.Get(t.Context(), ha.SecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if after.ResourceVersion != before.ResourceVersion {
			t.Fatalf("the Secret was written again (resourceVersion %s, was %s)", after.ResourceVersion, before.ResourceVersion)
		}
	})
}

// keptIdentity is the cluster ID in the ledger file at path.
func keptIdentity(t *testing.T, path string) string {
	t.Helper()
	l, err := ipam.Open(path, ipam.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Read, not loadIdentity: that would make an identity up where the
	// ledger kept aside holds none.
	seed, err := l.Key(keyIdentity)
	if err != nil {
		t.Fatalf("the ledger kept aside holds no identity: %v", err)
	}
	id, err := identity.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	return id.ClusterID()
}

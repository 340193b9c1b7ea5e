package chaos_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The message of a write the file system refused for space (ENOSPC), as
// the ledger's errors carry it.
const noSpace = "no space left on device"

// diskFull: the ledger's disk full while the victim must record
// something new: a long partition makes it release its views and, once
// healed, negotiate again; then it is restarted on the full disk, as a
// pod would be, and must start and serve. bbolt reuses the pages its file
// has, so those writes are rarely refused: the fault then takes the
// backing of every page of the ledger that holds nothing (punched out of
// the file, the agent stopped), so that the agent's next write needs the
// disk, and requires the witness that it was attempted and refused: the
// agent says "no space left on device". Once space returns the agent
// must start again, and its ledger must hold what it held: its identity
// and a view for every view its Peers show.
func diskFull(t *testing.T, f *fed, v *federation.Cluster) int {
	id := identityOf(t, v)
	from := len(v.Agent.Log())
	filler := harness.FillDisk(t, v.StateDir)
	f.partition(t, v, grace+5*time.Second)
	refused := strings.Contains(v.Agent.Log()[from:], noSpace)
	v.Agent.Kill()
	<-v.Agent.Done()
	v.StartAgent(t)
	broken := 0
	if err := readyWithin(v, 2*time.Minute); err != nil {
		t.Errorf("agent of %s restarted on a full disk: %v\n%s", v.Name, err, v.Agent.Tail(20))
		broken++
	}
	t.Logf("agent of %s, on the full disk through a long partition and a restart: a write refused for space: %v", v.Name, refused)

	v.Agent.Kill()
	<-v.Agent.Done()
	punched := punchSparePages(t, filepath.Join(v.StateDir, ipam.FileName))
	// The pages punched are free space on the disk again: fill it anew.
	filler = harness.FillDisk(t, v.StateDir)
	v.StartAgent(t)
	if err := refusedWithin(v, time.Minute); err != nil {
		t.Errorf("agent of %s with %d spare pages of its ledger unbacked on the full disk: %v\n%s", v.Name, punched, err, v.Agent.Tail(20))
		broken++
	} else {
		t.Logf("agent of %s had a write refused for space, with %d spare pages of its ledger unbacked", v.Name, punched)
	}
	v.Agent.Kill()
	<-v.Agent.Done()
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	v.StartAgent(t)
	if err := readyWithin(v, 2*time.Minute); err != nil {
		t.Errorf("agent of %s once space returned: %v\n%s", v.Name, err, v.Agent.Tail(20))
		broken++
	}
	f.afterHeal = func(t *testing.T) int { return ledgerKept(t, v, id) }
	return broken
}

// refusedWithin waits until c's agent says a write was refused for
// space (it may exit for it, or go on).
func refusedWithin(c *federation.Cluster, within time.Duration) error {
	deadline := time.Now().Add(within)
	for !strings.Contains(c.Agent.Log(), noSpace) {
		if exited, err := c.Agent.Exited(); exited {
			return fmt.Errorf("exited (%v) without saying %q", err, noSpace)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no write refused for space within %s", within)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// punchSparePages takes the disk's backing from every page of the bbolt
// file at path that holds no data (free pages, and the file's tail past
// its last page in use), as a sparse copy of the file would have it, and
// returns how many pages that was. The pages in use stay as they are. The
// file's owner must be stopped.
func punchSparePages(t *testing.T, path string) int {
	t.Helper()
	// bbolt finds the free pages by walking the tree of a copy opened
	// for writing (the agent keeps no free list in the file).
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "ledger-copy")
	if err := os.WriteFile(cp, src, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(cp, 0o600, &bolt.Options{NoFreelistSync: true})
	if err != nil {
		t.Fatalf("open a copy of %s: %v", path, err)
	}
	size := db.Info().PageSize
	var spare []int
	err = db.View(func(tx *bolt.Tx) error {
		for id := 2; ; id++ { // 0 and 1 are the meta pages
			p, err := tx.Page(id)
			if err != nil {
				return err
			}
			if p == nil { // past the last page in use
				for ; id*size < len(src); id++ {
					spare = append(spare, id)
				}
				return nil
			}
			if p.Type == "free" {
				spare = append(spare, id)
			}
		}
	})
	db.Close()
	if err != nil {
		t.Fatalf("the pages of a copy of %s: %v", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, id := range spare {
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(id*size), int64(size)); err != nil {
			t.Fatalf("punch page %d of %s: %v", id, path, err)
		}
	}
	return len(spare)
}

// ledgerKept checks, once the federation converged after the disk had
// space again, that v kept its identity and that its ledger holds every
// view its Peers show: nothing the agent wrote before or during the fault
// was lost. It returns the number of breaks.
func ledgerKept(t *testing.T, v *federation.Cluster, id string) int {
	t.Helper()
	broken := 0
	if now := identityOf(t, v); now != id {
		t.Errorf("%s came back from a full disk as %s, was %s", v.Name, now, id)
		broken++
	}
	l, err := ipam.OpenSnapshot(filepath.Join(v.StateDir, ipam.FileName))
	if err != nil {
		t.Errorf("%s's ledger after a full disk: %v", v.Name, err)
		return broken + 1
	}
	defer l.Close()
	held := map[string]bool{}
	for _, w := range l.Views("") {
		held[w.Peer+" "+w.View.String()] = true
	}
	var list v1alpha1.PeerList
	if err := v.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	shown := 0
	for _, p := range list.Items {
		for _, n := range p.Status.TheirNetworks {
			as, err := netip.ParsePrefix(n.As)
			if err != nil {
				t.Errorf("%s's view of %s: %v", v.Name, p.Status.ClusterName, err)
				broken++
				continue
			}
			shown++
			if !held[p.Name+" "+as.String()] {
				t.Errorf("%s's Peer %s shows the view %s, which its ledger lacks after the full disk", v.Name, p.Status.ClusterName, as)
				broken++
			}
		}
	}
	if shown == 0 {
		t.Errorf("%s's Peers show no view: nothing to compare its ledger with", v.Name)
		broken++
	}
	t.Logf("%s: identity and %d views kept through the full disk", v.Name, shown)
	return broken
}

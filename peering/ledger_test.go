package peering

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/flotilla-io/flotilla/ipam"
)

// failingLedger fails every batch that writes while failing is set, as a
// commit on a full or broken disk does: the batch's writes are undone.
type failingLedger struct {
	Ledger
	failing atomic.Bool
	failed  atomic.Int64
}

var errDisk = errors.New("commit ledger batch: no space left on device")

func (f *failingLedger) Batch(fn func(ipam.Batch) error) error {
	if !f.failing.Load() {
		return f.Ledger.Batch(fn)
	}
	wrote := false
	err := f.Ledger.Batch(func(b ipam.Batch) error {
		before := len(b.Views("")) + len(b.TheirViews(""))
		if err := fn(b); err != nil {
			return err
		}
		wrote = len(b.Views(""))+len(b.TheirViews("")) != before
		if wrote {
			return errDisk
		}
		return nil
	})
	if wrote {
		f.failed.Add(1)
	}
	return err
}

// A ledger that cannot be written holds up the peers whose views it
// cannot record, saying why, and no other: established peers keep their
// tunnels. Once it can be written again, the held-up peers connect.
func TestLedgerWriteFailureHoldsUpOnlyNewViews(t *testing.T) {
	net := &network{}
	led := &failingLedger{}
	a := newNode(t, net, nodeOptions{ledger: func(l Ledger) Ledger { led.Ledger = l; return led }})
	b, c := newNode(t, net, nodeOptions{}), newNode(t, net, nodeOptions{})
	meet(a, b)
	within(t, "a and b connected", func() error { return connected(a, b) })
	led.failing.Store(true)
	meet(a, b, c)
	within(t, "a's state of c says the ledger failed", func() error {
		s := stateOf(a, c)
		if s.ViewsAgreed.OK || !strings.Contains(s.ViewsAgreed.Message, "no space left on device") {
			return fmt.Errorf("ViewsAgreed %+v", s.ViewsAgreed)
		}
		return nil
	})
	if _, ok := a.dp.peer(c.id.ClusterID()); ok {
		t.Fatal("c is in a's data path though its views could not be recorded")
	}
	if err := connected(a, b); err != nil {
		t.Fatalf("a and b after a failed ledger write: %v", err)
	}
	if s := stateOf(a, b); !s.ViewsAgreed.OK {
		t.Fatalf("a's state of b after a failed ledger write: ViewsAgreed %+v", s.ViewsAgreed)
	}
	if led.failed.Load() == 0 {
		t.Fatal("no batch failed")
	}
	led.failing.Store(false)
	within(t, "a and c connected once the ledger is written", func() error { return connected(a, c) })
	within(t, "a's state of c agreed", func() error {
		if s := stateOf(a, c); !s.ViewsAgreed.OK {
			return fmt.Errorf("ViewsAgreed %+v", s.ViewsAgreed)
		}
		return nil
	})
}

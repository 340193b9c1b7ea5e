package ipam

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
)

// A full disk refuses the ledger's writes with an error that names the
// cause, loses nothing written before, and once space returns the ledger
// writes again, also after a reopen (the fault campaign's disk-full, at
// the ledger: the agent's writes there happen to fit in pages the file
// already has).
func TestLedgerOnAFullDisk(t *testing.T) {
	harness.Require(t, harness.Root)
	dir := t.TempDir()
	harness.SmallDisk(t, dir, "2m")
	path := filepath.Join(dir, FileName)
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	if err := l.PutKey("before", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	filler := harness.FillDisk(t, dir)

	// Writes that need more of the disk fail: write until one does.
	big := bytes.Repeat([]byte{1}, 64<<10)
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		werr = l.PutKey(fmt.Sprintf("k%d", i), big)
	}
	if werr == nil {
		t.Fatal("100 writes of 64 KiB on a full disk, none refused")
	}
	if !errors.Is(werr, syscall.ENOSPC) || !strings.Contains(werr.Error(), "put key") {
		t.Errorf("a write on a full disk: %v; want the key and no space left on device", werr)
	}
	if v, err := l.Key("before"); err != nil || string(v) != "kept" {
		t.Fatalf("on the full disk, the key written before: %q, %v", v, err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := l.PutKey("after", []byte("written")); err != nil {
		t.Fatalf("once space returned: %v", err)
	}
	l.Close()
	if l, err = Open(path, Options{}); err != nil {
		t.Fatalf("reopen after the full disk: %v", err)
	}
	for k, want := range map[string]string{"before": "kept", "after": "written"} {
		if v, err := l.Key(k); err != nil || string(v) != want {
			t.Errorf("after a reopen, key %s: %q, %v; want %q", k, v, err, want)
		}
	}
}

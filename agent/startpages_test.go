package agent

import (
	"encoding/json"
	"strings"
	"testing"
)

// Only the binary's mappings that are read-only and hold no private copy
// are released: not its writable data, not a relocated read-only part,
// not another file's.
func TestReadOnlyMappingsOf(t *testing.T) {
	smaps := `00400000-02000000 r-xp 00000000 fd:01 4242 /usr/bin/flotilla
Size:              28672 kB
Rss:               20000 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
02000000-04000000 r--p 01c00000 fd:01 4242 /usr/bin/flotilla
Size:              32768 kB
Anonymous:             0 kB
04000000-04100000 r--p 03c00000 fd:01 4242 /usr/bin/flotilla
Size:               1024 kB
Anonymous:            12 kB
04100000-04200000 rw-p 03d00000 fd:01 4242 /usr/bin/flotilla
Anonymous:           100 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 777 /usr/lib/libc.so.6
Anonymous:             0 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Anonymous:          1024 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Anonymous:           132 kB
`
	got, err := readOnlyMappingsOf(strings.NewReader(smaps), 4242)
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{{0x400000, 0x2000000}, {0x2000000, 0x4000000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("mappings %#v, want the code and the unmodified read-only data only: %#v", got, want)
	}
	if _, err := readOnlyMappingsOf(strings.NewReader("zz-02000000 r--p 0 fd:01 4242 /x\n"), 4242); err == nil {
		t.Fatal("a malformed range was accepted")
	}
}

// Released in this very process (a Go binary too), the binary's pages no
// longer count as resident, and the code keeps running: what it runs
// next is mapped back.
func TestReleaseStartPages(t *testing.T) {
	p, err := releaseStartPages(true)
	if err != nil {
		t.Fatal(err)
	}
	if p.released == 0 || p.fileAfter >= p.fileBefore {
		t.Fatalf("released %d bytes of mappings; RssFile %d before, %d after: want it lower", p.released, p.fileBefore, p.fileAfter)
	}
	// Code and read-only data (type descriptors, tables) in use again.
	b, err := json.Marshal(map[string][]int{"a": {1, 2, 3}})
	if err != nil || string(b) != `{"a":[1,2,3]}` {
		t.Fatalf("after the release: %s, %v", b, err)
	}
	t.Logf("released %d MiB of mappings; RssFile %d MiB before, %d MiB after", p.released>>20, p.fileBefore>>20, p.fileAfter>>20)
}

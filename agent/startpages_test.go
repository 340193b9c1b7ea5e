package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
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

// The pages of a file that no process maps leave the page cache: the
// binary's refaults then map only what is touched again, not the 64 KiB
// around each page (fault-around maps cached neighbours).
func TestEvictFromPageCache(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		// tmpfs pages are the file itself, never dropped: use the
		// checkout's file system, as a binary's would be.
		var err error
		if dir, err = os.MkdirTemp(".", ".dropcache-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	path := filepath.Join(dir, "binary")
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xcc}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil { // dirty pages are not dropped
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, f); err != nil {
		t.Fatal(err)
	}
	cached := func() int {
		t.Helper()
		m, err := unix.Mmap(int(f.Fd()), 0, 1<<20, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(m)
		vec := make([]byte, (1<<20)/os.Getpagesize())
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			t.Fatal(e)
		}
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	before := cached()
	if before == 0 {
		t.Fatal("the file just read is not in the page cache: nothing to witness")
	}
	if err := evictFromPageCache(path); err != nil {
		t.Fatal(err)
	}
	if after := cached(); after != 0 {
		t.Fatalf("%d of the file's pages cached after the drop, %d before: want none", after, before)
	}
	if err := evictFromPageCache(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("dropping the pages of a missing file: no error")
	}
}

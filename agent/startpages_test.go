package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/flotilla-io/flotilla/test/harness"
)

// The binary's mappings are read with their permissions, offsets and
// resident memory, and only those that are read-only and hold no
// private copy are released: not its writable data, not a relocated
// read-only part, not another file's.
func TestMappingsOf(t *testing.T) {
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
Rss:                  40 kB
Anonymous:            12 kB
04100000-04200000 rw-p 03d00000 fd:01 4242 /usr/bin/flotilla
Anonymous:           100 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 777 /usr/lib/libc.so.6
Rss:                 512 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Anonymous:          1024 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Anonymous:           132 kB
`
	got, err := mappingsOf(strings.NewReader(smaps), 4242)
	if err != nil {
		t.Fatal(err)
	}
	want := []fileMapping{
		{mapping{0x400000, 0x2000000}, "r-xp", 0, 20000 << 10, 0},
		{mapping{0x2000000, 0x4000000}, "r--p", 0x1c00000, 0, 0},
		{mapping{0x4000000, 0x4100000}, "r--p", 0x3c00000, 40 << 10, 12 << 10},
		{mapping{0x4100000, 0x4200000}, "rw-p", 0x3d00000, 0, 100 << 10},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("mappings\n%+v\nwant\n%+v", got, want)
	}
	var releasable []mapping
	for _, m := range got {
		if m.releasable() {
			releasable = append(releasable, m.mapping)
		}
	}
	if !slices.Equal(releasable, []mapping{{0x400000, 0x2000000}, {0x2000000, 0x4000000}}) {
		t.Fatalf("releasable %#v, want the code and the unmodified read-only data only", releasable)
	}
	for _, bad := range []string{"zz-02000000 r--p 0 fd:01 4242 /x\n", "01000000-02000000 r--p zz fd:01 4242 /x\n", "01000000-02000000 r--p 0 fd:01 4242 /x\nRss: many kB\n"} {
		if _, err := mappingsOf(strings.NewReader(bad), 4242); err == nil {
			t.Errorf("malformed smaps accepted: %q", bad)
		}
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
	if p.how != releasePagedOut {
		t.Errorf("the test binary, its own, released %q, want %q", p.how, releasePagedOut)
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
// around each page (fault-around maps cached neighbours). The file is
// just written, its pages dirty: the eviction writes them back first.
func TestEvictFromPageCache(t *testing.T) {
	path := filepath.Join(diskDir(t), "binary")
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xcc}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(io.Discard, f); err != nil {
		t.Fatal(err)
	}
	cached := func() uint64 {
		t.Helper()
		n, err := cachedBytes(path, 0, 1<<20)
		if err != nil {
			t.Fatal(err)
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
		t.Fatalf("%d bytes of the file cached after the drop, %d before: want none", after, before)
	}
	if err := evictFromPageCache(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("dropping the pages of a missing file: no error")
	}
}

// startPagesChildEnvVar makes the test binary release its own start
// pages and report what that left (startPagesChild) instead of running
// the tests: TestReleaseStartPagesLeavesOnlyWhatRuns runs it so.
const startPagesChildEnvVar = "FLOTILLA_TEST_STARTPAGES_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(startPagesChildEnvVar) != "" {
		if err := startPagesChild(os.Stdout, os.Getenv(startPagesChildEnvVar) == "busy"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childPages is what startPagesChild reports, in bytes: what the release
// did, then, of the binary's read-only data (the runtime's tables among
// them), how much the page cache holds and how much the process maps,
// read in this order (a page faulted in between can only add to the
// second).
type childPages struct {
	How                   string
	FileBefore, FileAfter uint64
	Cached, Mapped        uint64
}

// startPagesChild releases the start pages, evicted, busy or not: while
// goroutines look up the function at every page of the code
// (runtime.FuncForPC reads the runtime's tables across their megabytes,
// as the collector and stack traces do). Then it reports on w what is
// cached and mapped of the read-only data. Not of the code: on Linux
// 6.17 and later a fault in executable memory reads ahead whatever the
// madvise (commit 3b61a3f08949), so the page cache holds more of it
// than runs.
func startPagesChild(w io.Writer, busy bool) error {
	exe, err := os.Stat(selfExe)
	if err != nil {
		return err
	}
	ino := exe.Sys().(*syscall.Stat_t).Ino
	code, err := mappingOf(ino, "r-xp")
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if busy {
		for g := range 2 {
			wg.Go(func() { lookUpFunctions(code.mapping, uintptr(g)<<11, stop) })
		}
	}
	p, err := releaseStartPages(true)
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	data, err := mappingOf(ino, "r--p")
	if err != nil {
		return err
	}
	cached, err := cachedBytes(selfExe, data.off, int(data.end-data.start))
	if err != nil {
		return err
	}
	if data, err = mappingOf(ino, "r--p"); err != nil {
		return err
	}
	return json.NewEncoder(w).Encode(childPages{How: p.how, FileBefore: p.fileBefore, FileAfter: p.fileAfter, Cached: cached, Mapped: data.rss - data.anon})
}

// mappingOf is the process's first mapping of the file with inode ino
// with permissions perms.
func mappingOf(ino uint64, perms string) (fileMapping, error) {
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return fileMapping{}, err
	}
	ms, err := mappingsOf(bytes.NewReader(smaps), ino)
	if err != nil {
		return fileMapping{}, err
	}
	for _, m := range ms {
		if m.perms == perms {
			return m, nil
		}
	}
	return fileMapping{}, fmt.Errorf("no %s mapping of inode %d in /proc/self/smaps", perms, ino)
}

// cachedBytes is how much of the file at path, size bytes from off, the
// page cache holds: mincore on a mapping of it that touches nothing
// (the kernel tells the truth to the file's owner only).
func cachedBytes(path string, off int64, size int) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), off, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, e
	}
	var n uint64
	for _, v := range vec {
		n += uint64(v & 1)
	}
	return n * uint64(page), nil
}

// After the release, the page cache holds of the binary's read-only
// data only what the process maps again, even while its threads run
// through the runtime's tables as the pages leave: the pages they map
// in that instant go with the rest, instead of staying cached whole for
// later faults to map back with their neighbourhoods. The binary is a
// copy written at once, whose page cache holds folios of up to 2 MiB,
// where the most is at stake. Owned by another user, the release falls
// back to unmapping, then evicting.
func TestReleaseStartPagesLeavesOnlyWhatRuns(t *testing.T) {
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(diskDir(t), "agent.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	// Not synced: the release writes the dirty pages back itself.
	run := func(t *testing.T, busy bool) childPages {
		t.Helper()
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), startPagesChildEnvVar+"=quiet")
		if busy {
			cmd.Env = append(os.Environ(), startPagesChildEnvVar+"=busy")
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the child: %v: %s", err, stderr.Bytes())
		}
		var p childPages
		if err := json.Unmarshal(out, &p); err != nil {
			t.Fatalf("the child's report %q: %v", out, err)
		}
		t.Logf("busy %v, %s: RssFile %d KiB before, %d KiB after; of the read-only data %d KiB cached, %d KiB mapped", busy, p.How, p.FileBefore>>10, p.FileAfter>>10, p.Cached>>10, p.Mapped>>10)
		return p
	}
	t.Run("owner", func(t *testing.T) {
		p := run(t, false)
		if p.How != releasePagedOut {
			t.Fatalf("released %q, want %q", p.How, releasePagedOut)
		}
		if p.FileAfter > p.FileBefore/2 {
			t.Errorf("RssFile %d KiB after the release, %d KiB before: want less than half", p.FileAfter>>10, p.FileBefore>>10)
		}
		p = run(t, true)
		if p.Cached > p.Mapped+startPagesSlack {
			t.Errorf("of the read-only data %d KiB cached, %d KiB mapped: %d KiB cached that the process does not map, want at most %d",
				p.Cached>>10, p.Mapped>>10, (p.Cached-p.Mapped)>>10, startPagesSlack>>10)
		}
	})
	t.Run("another user's binary", func(t *testing.T) {
		harness.Require(t, harness.Root)
		if err := os.Chown(bin, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		p := run(t, false)
		if p.How != releaseEvicted {
			t.Fatalf("released %q, want %q", p.How, releaseEvicted)
		}
		if p.FileAfter >= p.FileBefore {
			t.Errorf("RssFile %d KiB after the release, %d KiB before: want it lower", p.FileAfter>>10, p.FileBefore>>10)
		}
	})
}

// startPagesSlack is how much of the binary's read-only data the page
// cache may hold beyond what the process maps after the release.
const startPagesSlack = 256 << 10

// diskDir is a temporary directory on a file system whose pages can
// leave the page cache: tmpfs pages are the file itself, never dropped,
// so then one in the checkout, as a binary's would be on disk.
func diskDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		var err error
		if dir, err = os.MkdirTemp(".", ".dropcache-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return dir
}

// lookUpFunctions looks up the function at every 4 KiB of code from
// offset from, over and over until stop is closed.
func lookUpFunctions(code mapping, from uintptr, stop <-chan struct{}) {
	for {
		for pc := code.start + from; pc < code.end; pc += 4 << 10 {
			if f := runtime.FuncForPC(pc); f != nil {
				_ = f.Name()
			}
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}

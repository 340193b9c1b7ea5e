package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The agent's binary is 90 MB, most of it Kubernetes API types and
// client code that runs once, at start: package initialisers register
// every API group, informers decode their first lists. The kernel maps
// what ran into the process, 64 KiB around each page touched (its
// fault-around) or a whole 2 MiB folio at once, and leaves it mapped:
// those clean pages of the binary are half of the agent's resident
// memory (docs/offload.md, "Memory"). Once the components have
// started, releaseStartPages unmaps the binary's read-only mappings
// (code, read-only data, the runtime's tables), as a kernel frees its
// init sections: the pages stay in the page cache, and what the agent
// runs from then on is mapped back, one page at a time (minor faults,
// no I/O), so its resident memory is what it uses, not what it once
// ran (and, evicted, what it uses is what the page cache holds of
// it). Three things make the refaults small:
//   - the process no longer maps file folios as 2 MiB pages
//     (PR_SET_THP_DISABLE, inherited by nothing the agent starts);
//   - MADV_RANDOM turns off read-ahead for all the binary's mappings
//     (a read fault in its writable data would otherwise read the 8 MiB
//     around it, the tables beside it in the file among them). It does
//     not stop the kernel's fault-around, which maps the 64 KiB around
//     each faulted page that the page cache holds (measured on 6.18:
//     one touch, 16 pages), nor its mapping of a whole large folio; nor,
//     since Linux 6.17 (commit 3b61a3f08949), the read-ahead of
//     executable memory, which reads up to the device's read-ahead size
//     (128 KiB by default, 8 MiB on the machines measured) from each
//     page of code faulted in. With evict, the released pages also
//     leave the page cache (unless another process maps them), so a
//     fault in the read-only data reads its page alone, from the disk
//     the first time: the resident pages are then those used, not their
//     neighbourhoods; the code's are those used and what fault-around
//     maps of the read-ahead;
//   - evicted, they leave in three steps: the pages no process maps
//     (POSIX_FADV_DONTNEED), then those mapped here, each folio
//     unmapped and dropped in one step (MADV_PAGEOUT), then what that
//     split off a large folio mapped in part. Unmapping all first
//     (MADV_DONTNEED) and evicting after, as the agent did before, let
//     its threads map back in between, with their neighbourhoods, the
//     folios they touched, which then stayed cached whole: 2.7 to 18
//     MiB mapped right after the release depending on what ran in that
//     instant (1.6 to 6 paged out), and the agent's resident memory
//     differed by up to 4 MiB from one start to the next
//     (docs/offload.md, "The eighth round"). The kernel pages out a
//     file's pages only for its owner (or a process that may write it),
//     and silently otherwise: for another user's binary the pages are
//     unmapped, then evicted, as before;
//   - MADV_DONTNEED is safe only on mappings that hold no private copy:
//     a read-only mapping the loader relocated (a position-independent
//     binary's RELRO) has anonymous pages, and dropping them would bring
//     back the unrelocated file; such mappings are left alone.

// ReleaseStartPages unmaps the pages of the binary its start ran (above)
// and logs what that did; the agent calls it once its components have
// started, the fabric once its node applied a first plan. A failure
// costs only memory.
func ReleaseStartPages(log *slog.Logger, evict bool) {
	p, err := releaseStartPages(evict)
	if err != nil {
		log.Warn("the binary's start pages stay mapped", "err", err)
		return
	}
	const mib = 1 << 20
	log.Info("the binary's start pages released", "mappedMiB", p.released/mib, "residentMiBBefore", p.fileBefore/mib, "residentMiBAfter", p.fileAfter/mib,
		"evictedFromPageCache", evict, "how", p.how)
}

// startPages is what releaseStartPages did: the bytes of mappings
// released, the process's file-backed resident memory (RssFile) before
// and after, and how the pages left (one of the release* below).
type startPages struct {
	released, fileBefore, fileAfter uint64
	how                             string
}

// How the start pages left: unmapped only (left in the page cache);
// paged out (unmapped and dropped together, see above); or, where the
// kernel pages out only the file's owner's, unmapped, then evicted.
const (
	releaseUnmapped = "unmapped"
	releasePagedOut = "paged out"
	releaseEvicted  = "unmapped, then evicted"
)

// releaseStartPages unmaps the read-only, unmodified mappings of the
// running binary (see above). Errors leave the process as it was, apart
// from mappings already released, which is harmless.
func releaseStartPages(evict bool) (startPages, error) {
	var out startPages
	exe, err := os.Stat(selfExe)
	if err != nil {
		return out, fmt.Errorf("the running binary: %w", err)
	}
	st, ok := exe.Sys().(*syscall.Stat_t)
	if !ok {
		return out, errors.New("the running binary: no inode")
	}
	if out.fileBefore, err = rssFile(); err != nil {
		return out, err
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return out, err
	}
	mappings, err := mappingsOf(bytes.NewReader(smaps), st.Ino)
	if err != nil {
		return out, err
	}
	var all, regions []mapping
	for _, m := range mappings {
		all = append(all, m.mapping)
		if m.releasable() {
			regions = append(regions, m.mapping)
		}
	}
	if len(regions) == 0 {
		return out, errors.New("no read-only mapping of the running binary in /proc/self/smaps")
	}
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		return out, fmt.Errorf("prctl(PR_SET_THP_DISABLE): %w", err)
	}
	// All of them: a read fault in the writable data would otherwise
	// read around it, into the tables next to it in the file.
	if err := advise(all, unix.MADV_RANDOM); err != nil {
		return out, err
	}
	for _, r := range regions {
		out.released += uint64(r.end - r.start)
	}
	switch {
	case !evict:
		out.how, err = releaseUnmapped, advise(regions, unix.MADV_DONTNEED)
	case st.Uid == uint32(os.Geteuid()):
		out.how, err = releasePagedOut, pageOut(regions)
	default:
		out.how, err = releaseEvicted, advise(regions, unix.MADV_DONTNEED)
		if err == nil {
			err = evictFromPageCache(selfExe)
		}
	}
	if err != nil {
		return out, err
	}
	out.fileAfter, err = rssFile()
	return out, err
}

// selfExe is the running binary.
const selfExe = "/proc/self/exe"

// advise applies madvise(advice) to each of regions.
func advise(regions []mapping, advice int) error {
	for _, r := range regions {
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, uintptr(advice)); e != 0 {
			return fmt.Errorf("madvise(%#x-%#x, %d): %w", r.start, r.end, advice, e)
		}
	}
	return nil
}

// pageOut drops the running binary's pages in regions from the process
// and the page cache (see above): first the cached pages no process
// maps, then those mapped in regions, each folio unmapped and dropped at
// once, so that none is mapped back in between; last the parts of large
// folios, mapped here in part, that MADV_PAGEOUT split off and left. A
// folio another process maps stays, mapped here too. The kernel pages
// out only the pages of a file its caller owns (or may write), and
// without an error otherwise: the caller checks.
func pageOut(regions []mapping) error {
	if err := evictFromPageCache(selfExe); err != nil {
		return err
	}
	if err := advise(regions, unix.MADV_PAGEOUT); err != nil {
		return err
	}
	return evictFromPageCache(selfExe)
}

// evictFromPageCache drops the cached pages of the file at path (the
// running binary) that no process maps (POSIX_FADV_DONTNEED drops
// clean, unmapped pages only): the pages another process of the same
// binary maps stay. A binary written moments before (a layer just
// extracted, a test just linked) has dirty pages, which neither this
// nor MADV_PAGEOUT drops: it is written back first, where the file
// system lets a reader do so (overlayfs does not sync a lower layer's
// file, and says nothing; its pages leave once the kernel has written
// them back, within 30 s by default, for a later release).
func evictFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("the running binary: %w", err)
	}
	defer f.Close()
	_ = unix.Fdatasync(int(f.Fd())) // best effort: only the eviction's reach depends on it
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise(DONTNEED) on %s: %w", path, err)
	}
	return nil
}

// mapping is an address range of the process.
type mapping struct{ start, end uintptr }

// fileMapping is a mapping of a file as /proc/PID/smaps describes it:
// its range, permissions (rwxp), offset in the file, resident memory and
// private copies (Anonymous), in bytes.
type fileMapping struct {
	mapping
	perms     string
	off       int64
	rss, anon uint64
}

// releasable tells a mapping whose pages can be unmapped as they are
// (see above): not writable, with no private copy.
func (m fileMapping) releasable() bool {
	return !strings.ContainsRune(m.perms, 'w') && m.anon == 0
}

// mappingsOf reads smaps and returns the mappings of the file with
// inode ino.
func mappingsOf(r io.Reader, ino uint64) ([]fileMapping, error) {
	var (
		out []fileMapping
		cur *fileMapping
	)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if isMappingHeader(f) {
			cur = nil
			// start-end perms offset dev inode [path]
			if n, err := strconv.ParseUint(f[4], 10, 64); err != nil || n != ino {
				continue
			}
			addrs := strings.SplitN(f[0], "-", 2)
			start, err1 := strconv.ParseUint(addrs[0], 16, 64)
			end, err2 := strconv.ParseUint(addrs[1], 16, 64)
			off, err3 := strconv.ParseInt(f[2], 16, 64)
			if err1 != nil || err2 != nil || err3 != nil || end <= start {
				return nil, fmt.Errorf("smaps: bad mapping %q", sc.Text())
			}
			out = append(out, fileMapping{mapping: mapping{uintptr(start), uintptr(end)}, perms: f[1], off: off})
			cur = &out[len(out)-1]
			continue
		}
		if cur == nil || len(f) < 2 || (f[0] != "Rss:" && f[0] != "Anonymous:") {
			continue
		}
		kb, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("smaps: bad line %q", sc.Text())
		}
		if f[0] == "Rss:" {
			cur.rss = kb << 10
		} else {
			cur.anon = kb << 10
		}
	}
	return out, sc.Err()
}

// isMappingHeader tells a mapping's first line (start-end perms offset
// dev inode [path]) from its "Key: value" lines.
func isMappingHeader(f []string) bool {
	return len(f) >= 5 && !strings.HasSuffix(f[0], ":") && strings.Contains(f[0], "-") && len(f[1]) == 4
}

// rssFile reads the process's file-backed resident memory, in bytes.
func rssFile() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/self/status: %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/self/status has no RssFile")
}

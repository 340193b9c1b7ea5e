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
//   - MADV_RANDOM turns off read-ahead for the mappings; it does not
//     stop the kernel's fault-around, which maps the 64 KiB around each
//     faulted page that the page cache holds (measured on 6.18: one
//     touch, 16 pages), nor its mapping of a whole large folio. With
//     evict, the released pages also leave the page cache (unless a
//     process maps them), so a fault reads its page alone, from the
//     disk the first time: the resident pages are then those used, not
//     their neighbourhoods. A folio the agent maps again in the instant
//     between the release and the eviction stays cached whole;
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
		"evictedFromPageCache", evict)
}

// startPages is what releaseStartPages did: the bytes of mappings
// released, and the process's file-backed resident memory (RssFile)
// before and after.
type startPages struct {
	released, fileBefore, fileAfter uint64
}

// releaseStartPages unmaps the read-only, unmodified mappings of the
// running binary (see above). Errors leave the process as it was, apart
// from mappings already released, which is harmless.
func releaseStartPages(evict bool) (startPages, error) {
	var out startPages
	exe, err := os.Stat("/proc/self/exe")
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
	regions, err := readOnlyMappingsOf(bytes.NewReader(smaps), st.Ino)
	if err != nil {
		return out, err
	}
	if len(regions) == 0 {
		return out, errors.New("no read-only mapping of the running binary in /proc/self/smaps")
	}
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		return out, fmt.Errorf("prctl(PR_SET_THP_DISABLE): %w", err)
	}
	for _, r := range regions {
		for _, advice := range []int{unix.MADV_RANDOM, unix.MADV_DONTNEED} {
			if _, _, e := unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, uintptr(advice)); e != 0 {
				return out, fmt.Errorf("madvise(%#x-%#x, %d): %w", r.start, r.end, advice, e)
			}
		}
		out.released += uint64(r.end - r.start)
	}
	if evict {
		if err := evictFromPageCache("/proc/self/exe"); err != nil {
			return out, err
		}
	}
	out.fileAfter, err = rssFile()
	return out, err
}

// evictFromPageCache drops the cached pages of the file at path (the
// running binary) that no process maps (POSIX_FADV_DONTNEED drops
// clean, unmapped pages only): the pages another process of the same
// binary maps stay.
func evictFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("the running binary: %w", err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise(DONTNEED) on %s: %w", path, err)
	}
	return nil
}

// mapping is an address range of the process.
type mapping struct{ start, end uintptr }

// readOnlyMappingsOf reads smaps and returns the mappings of the file
// with inode ino that are not writable and hold no anonymous page.
func readOnlyMappingsOf(r io.Reader, ino uint64) ([]mapping, error) {
	var (
		out     []mapping
		cur     *mapping
		curAnon = true // until the header of a candidate is read
	)
	flush := func() {
		if cur != nil && !curAnon {
			out = append(out, *cur)
		}
		cur, curAnon = nil, true
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if isMappingHeader(f) {
			flush()
			// start-end perms offset dev inode [path]
			if strings.ContainsRune(f[1], 'w') {
				continue
			}
			if n, err := strconv.ParseUint(f[4], 10, 64); err != nil || n != ino {
				continue
			}
			addrs := strings.SplitN(f[0], "-", 2)
			start, err1 := strconv.ParseUint(addrs[0], 16, 64)
			end, err2 := strconv.ParseUint(addrs[1], 16, 64)
			if err1 != nil || err2 != nil || end <= start {
				return nil, fmt.Errorf("smaps: bad range %q", f[0])
			}
			cur = &mapping{uintptr(start), uintptr(end)}
			continue
		}
		if cur != nil && f[0] == "Anonymous:" && len(f) >= 2 {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("smaps: bad Anonymous line %q", sc.Text())
			}
			curAnon = kb != 0
		}
	}
	flush()
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

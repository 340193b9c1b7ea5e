package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// MemoryCgroup is the memory cgroup of a container on a real node: what
// the kubelet (cAdvisor) and `kubectl top` read the container's memory
// from.
type MemoryCgroup struct {
	// Dir is the cgroup's directory in the memory hierarchy.
	Dir string
	// V2 says it is a cgroup v2 (unified) one: memory.current and
	// memory.stat's inactive_file; v1: memory.usage_in_bytes and
	// memory.stat's total_inactive_file.
	V2 bool
}

// CgroupMemory is one reading of a MemoryCgroup, in bytes.
type CgroupMemory struct {
	// Usage is the memory charged to the cgroup: anonymous memory, page
	// cache, kernel memory.
	Usage uint64
	// InactiveFile is the page cache the kernel would reclaim first.
	InactiveFile uint64
	// Anon and File are the anonymous memory and the page cache charged
	// (v1: total_rss, total_cache; v2: anon, file); MappedFile is the
	// page cache mapped into a process of the cgroup.
	Anon, File, MappedFile uint64
}

// WorkingSet is the kubelet's working set: the usage less the inactive
// page cache, what `kubectl top` shows and what the kubelet evicts by.
func (m CgroupMemory) WorkingSet() uint64 {
	if m.InactiveFile > m.Usage {
		return 0
	}
	return m.Usage - m.InactiveFile
}

// MemoryCgroupOf returns the memory cgroup of process pid, a container's
// process on node n: it must lie under the node's cgroupRoot.
func (n *Node) MemoryCgroupOf(pid int) (MemoryCgroup, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return MemoryCgroup{}, fmt.Errorf("the cgroups of process %d: %w", pid, err)
	}
	// hierarchy-ID:controllers:path; v2's is 0::path.
	var v1Path, v2Path string
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2Path = f[2]
		case strings.Contains(","+f[1]+",", ",memory,"):
			v1Path = f[2]
		}
	}
	root := "/" + n.cgroup
	for _, h := range cgroupHierarchies() {
		var cg MemoryCgroup
		switch {
		case v1Path != "" && fileExists(filepath.Join(h, "memory.usage_in_bytes")):
			cg = MemoryCgroup{Dir: filepath.Join(h, v1Path)}
		case v1Path == "" && v2Path != "" && hasMemoryController(h):
			cg = MemoryCgroup{Dir: filepath.Join(h, v2Path), V2: true}
		default:
			continue
		}
		rel := strings.TrimPrefix(cg.Dir, h)
		if rel != root && !strings.HasPrefix(rel, root+"/") {
			return MemoryCgroup{}, fmt.Errorf("process %d is in memory cgroup %s, not under node %s's cgroupRoot %s", pid, rel, n.NodeName, root)
		}
		return cg, nil
	}
	return MemoryCgroup{}, fmt.Errorf("process %d: no memory cgroup in %q", pid, raw)
}

// Read reads the cgroup's memory.
func (cg MemoryCgroup) Read() (CgroupMemory, error) {
	usageFile, prefix := "memory.usage_in_bytes", "total_"
	if cg.V2 {
		usageFile, prefix = "memory.current", ""
	}
	raw, err := os.ReadFile(filepath.Join(cg.Dir, usageFile))
	if err != nil {
		return CgroupMemory{}, err
	}
	var m CgroupMemory
	if m.Usage, err = strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64); err != nil {
		return CgroupMemory{}, fmt.Errorf("%s: %w", filepath.Join(cg.Dir, usageFile), err)
	}
	stat, err := os.ReadFile(filepath.Join(cg.Dir, "memory.stat"))
	if err != nil {
		return CgroupMemory{}, err
	}
	want := map[string]*uint64{"inactive_file": &m.InactiveFile, "file_mapped": &m.MappedFile}
	if cg.V2 {
		want["anon"], want["file"] = &m.Anon, &m.File
	} else {
		want["rss"], want["cache"], want["mapped_file"] = &m.Anon, &m.File, &m.MappedFile
		delete(want, "file_mapped")
	}
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(stat))
	for sc.Scan() {
		key, v, ok := strings.Cut(sc.Text(), " ")
		name, isTotal := strings.CutPrefix(key, prefix)
		if p := want[name]; ok && isTotal && p != nil {
			if *p, err = strconv.ParseUint(v, 10, 64); err != nil {
				return CgroupMemory{}, fmt.Errorf("%s/memory.stat: %q: %w", cg.Dir, sc.Text(), err)
			}
			found++
		}
	}
	if found != len(want) {
		return CgroupMemory{}, fmt.Errorf("%s/memory.stat lacks some of %v (prefixed %q)", cg.Dir, slices.Sorted(maps.Keys(want)), prefix)
	}
	return m, nil
}

func hasMemoryController(h string) bool {
	b, err := os.ReadFile(filepath.Join(h, "cgroup.controllers"))
	return err == nil && slices.Contains(strings.Fields(string(b)), "memory")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

package harness

import (
	"os"
	"path/filepath"
	"testing"
)

// A container's memory cgroup reads as the kubelet reads it: the usage,
// and the working set without the inactive page cache, from the
// hierarchical totals in v1 and the plain keys in v2.
func TestMemoryCgroupRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v2    bool
		files map[string]string
		want  CgroupMemory
		ws    uint64
	}{{
		name: "v1",
		files: map[string]string{
			"memory.usage_in_bytes": "1000\n",
			// The cgroup's own counts come first; the totals include its children.
			"memory.stat": "cache 1\nrss 2\nmapped_file 3\ninactive_file 4\ntotal_cache 300\ntotal_rss 600\ntotal_mapped_file 50\ntotal_inactive_file 200\ntotal_active_file 100\n",
		},
		want: CgroupMemory{Usage: 1000, InactiveFile: 200, Anon: 600, File: 300, MappedFile: 50},
		ws:   800,
	}, {
		name:  "v2",
		v2:    true,
		files: map[string]string{"memory.current": "1000\n", "memory.stat": "anon 600\nfile 300\nfile_mapped 50\nactive_file 100\ninactive_file 200\n"},
		want:  CgroupMemory{Usage: 1000, InactiveFile: 200, Anon: 600, File: 300, MappedFile: 50},
		ws:    800,
	}, {
		name:  "more inactive page cache than usage",
		v2:    true,
		files: map[string]string{"memory.current": "100\n", "memory.stat": "anon 0\nfile 300\nfile_mapped 0\ninactive_file 300\n"},
		want:  CgroupMemory{Usage: 100, InactiveFile: 300, File: 300},
		ws:    0,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := MemoryCgroup{Dir: dir, V2: tc.v2}.Read()
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || got.WorkingSet() != tc.ws {
				t.Errorf("read %+v (working set %d), want %+v (%d)", got, got.WorkingSet(), tc.want, tc.ws)
			}
		})
	}
	// A memory.stat without the keys is an error, not zeros.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "memory.usage_in_bytes"), []byte("1000\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.stat"), []byte("cache 1\nrss 2\n"), 0o644)
	if m, err := (MemoryCgroup{Dir: dir}).Read(); err == nil {
		t.Errorf("v1 memory.stat without totals read as %+v", m)
	}
}

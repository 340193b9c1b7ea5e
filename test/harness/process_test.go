package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An exited process's error leads with the last error it logged, in
// klog's format (header cut) or logrus's.
func TestProcessLastError(t *testing.T) {
	for _, tc := range []struct{ name, log, want string }{
		{
			name: "kubelet",
			log: `I1123 16:00:00.013613   30735 factory.go:223] Registration of the systemd container factory successfully
E1123 16:00:00.013847   30735 manager.go:294] Registration of the raw container factory failed: inotify_init: too many open files
E1123 16:00:00.013897   30735 kubelet.go:1687] "Failed to start cAdvisor" err="inotify_init: too many open files"
`,
			want: `"Failed to start cAdvisor" err="inotify_init: too many open files"`,
		},
		{
			name: "containerd",
			log: `time="2026-11-23T15:59:53Z" level=fatal msg="failed to load plugin"
time="2026-11-23T15:59:54Z" level=warning msg="later"
`,
			want: `time="2026-11-23T15:59:53Z" level=fatal msg="failed to load plugin"`,
		},
		{name: "no error", log: "I1123 16:00:00.003519   30735 reconciler.go:29] \"start\"\n", want: ""},
		{name: "empty", log: "", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			if err := os.WriteFile(path, []byte(tc.log), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := (&Process{LogPath: path}).lastError(); got != tc.want {
				t.Fatalf("lastError = %q, want %q", got, tc.want)
			}
		})
	}
}

// A failed test's quiet processes name what stalled them: etcd's
// requests of seconds and an API server's shutdown, not its routine
// slow requests or the start's "waiting for shutdown to be initiated".
func TestProcessTroubles(t *testing.T) {
	log := `2026-12-02 10:54:10.109171 W | etcdserver: read-only range request "key:\"/registry/health\" " with result "range_response_count:0 size:5" took too long (182.144905ms) to execute
I1202 10:55:02.005209    5757 genericapiserver.go:702] [graceful-termination] waiting for shutdown to be initiated
2026-12-02 10:54:11.000001 W | etcdserver: read-only range request "key:\"/registry/leases\" " with result "error:context canceled" took too long (12.5s) to execute
I1202 10:56:30.463593    8278 genericapiserver.go:1100] "[graceful-termination] shutdown event" name="ShutdownInitiated"
2026-12-02 10:54:12.000001 W | wal: sync duration of 1.2s, expected less than 1s
`
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got := (&Process{LogPath: path}).troubles(2)
	want := "3 lines, the last:\n" + strings.Join(strings.Split(log, "\n")[3:5], "\n")
	if got != want {
		t.Fatalf("troubles = %q, want %q", got, want)
	}
	if err := os.WriteFile(path, []byte(strings.Split(log, "\n")[0]+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := (&Process{LogPath: path}).troubles(2); got != "" {
		t.Fatalf("troubles of a routine log = %q, want none", got)
	}
}

package harness

import (
	"os"
	"path/filepath"
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

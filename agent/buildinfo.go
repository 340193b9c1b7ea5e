package agent

import "runtime/debug"

// Version and Commit are set at link time by the Makefile
// (-X github.com/flotilla-io/flotilla/agent.Version=...).
var (
	Version = "dev"
	Commit  = ""
)

// BuildCommit returns Commit, or the VCS revision Go recorded in the
// binary when the linker was not told.
func BuildCommit() string {
	if Commit != "" {
		return Commit
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

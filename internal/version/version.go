// Package version is what this binary was built from: the release it was
// cut as, the commit and that commit's date, stamped at link time by
// `make build` and `make release`:
//
//	-ldflags "-X github.com/flotilla-io/flotilla/internal/version.Version=v0.3.0
//	          -X github.com/flotilla-io/flotilla/internal/version.Commit=<sha>
//	          -X github.com/flotilla-io/flotilla/internal/version.Date=<commit date>"
//
// The date is the commit's, not the build's, so the same commit builds the
// same bytes.
package version

import (
	"runtime"
	"runtime/debug"
)

// Set by the linker (-X); a plain `go build` leaves Version "dev".
var (
	Version = "dev"
	Commit  = ""
	Date    = ""
)

// Info is one build, as `flotilla version` prints it and the agent serves
// it on /version.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	// Date is the commit's date (RFC 3339), empty when not stamped.
	Date      string `json:"date,omitempty"`
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
	// Protocol is the peering protocol range the build speaks; zero where
	// the binary does not say (its caller fills it from peering).
	Protocol Protocol `json:"protocol"`
}

// Protocol is a peering protocol range: the version written and the
// versions read.
type Protocol struct {
	Current int `json:"current"`
	Min     int `json:"min"`
	Max     int `json:"max"`
}

// Get is this binary's build, without the protocol range.
func Get() Info {
	return Info{
		Version:   Version,
		Commit:    commit(),
		Date:      Date,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// commit is Commit, else the revision Go recorded when it built from a
// checkout (not with -buildvcs=false), else "unknown".
func commit() string {
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

package protocol

import (
	"testing"

	"github.com/flotilla-io/flotilla/internal/version"
)

// previousRelease is the range of the release before this one (before
// grants: it wrote 3 and read 2 to 4). Raise it to this build's range when
// cutting a release.
var previousRelease = version.Protocol{Current: 3, Min: 2, Max: 4}

// The version skew policy (docs/release.md, "Version skew"): an agent of
// this build peers with agents of the previous release, and the CLI of
// this build works against them, each reading what the other writes. A
// change of Min or Current that breaks that fails here, before a release
// strands clusters that upgrade one at a time.
func TestThisBuildInteroperatesWithThePreviousRelease(t *testing.T) {
	this := Range()
	if this.Min > this.Current || this.Current > this.Max {
		t.Fatalf("range %+v: Current must be within Min..Max", this)
	}
	if !this.Interoperates(previousRelease) {
		t.Errorf("this build (writes %d, reads %d to %d) and the previous release (writes %d, reads %d to %d) do not read each other: agents of the two cannot peer during an upgrade",
			this.Current, this.Min, this.Max, previousRelease.Current, previousRelease.Min, previousRelease.Max)
	}
}

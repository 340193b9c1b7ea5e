// Package protocol is the peering protocol's version range, apart from the
// negotiation, so that a build can say what it speaks (`flotilla version`,
// the agent's /build) without linking the tunnel: the CLI builds for
// platforms the data path does not run on.
package protocol

import "github.com/flotilla-io/flotilla/internal/version"

// The range, as memberlist has it, so clusters upgrade one at a time: an
// agent writes Current and reads every version from Min to Max. A version
// within the range may only add fields (ignored by readers that do not
// know them); a change of meaning takes a number above Max, and its agents
// keep writing a version older ones read until every cluster is upgraded.
//
// Version 2 signs the signing domain with the payload; version 1 signed
// the payload alone and is no longer read. Version 3 adds tunnelReady,
// version 4 grant and labels (4 is not released yet: fields may still
// join it).
const (
	Current = 4
	Min     = 2
	Max     = 5
)

// Range is the range as a build reports it.
func Range() version.Protocol {
	return version.Protocol{Current: Current, Min: Min, Max: Max}
}

// Build is this binary's build with the range it speaks: what `flotilla
// version` prints and the agent serves on /build.
func Build() version.Info {
	b := version.Get()
	b.Protocol = Range()
	return b
}

// Package conformance runs the upstream Multi-Cluster Services API
// conformance suite against two clusters of real nodes with Flotilla's
// agents: `make conformance` (docs/testing.md). The suite's source is not
// part of this repository; MCS_CONFORMANCE names a checkout of it.
//
// The run itself is behind the build tag "conformance": it takes the
// better part of an hour and needs the suite's source, so `go test ./...`
// and `make test` leave it out rather than skip it. What it is made of
// (building the suite, the kubeconfig, reading the suite's report) is
// here without the tag, tested by `make test`.
package conformance

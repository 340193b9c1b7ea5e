// Package conformance runs the upstream Multi-Cluster Services API
// conformance suite against two clusters of real nodes with Flotilla's
// agents: `make conformance` runs every label, `make test` the Required
// one (docs/testing.md). The suite's source is third_party/mcs-conformance,
// upstream's unmodified; MCS_CONFORMANCE names another copy of it.
//
// The run itself is behind the build tag "conformance": it builds a
// second module and starts two clusters of real nodes, so a plain
// `go test ./...` leaves it out rather than skip it; `make test` asks for
// it. What it is made of (building the suite, the kubeconfig, reading the
// suite's report) is here without the tag.
package conformance

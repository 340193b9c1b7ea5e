# Flotilla: peer-to-peer federation of Kubernetes clusters.
# `make demo` and `make test` are the two commands of the README.

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's date, not the build's, so a commit always builds the same bytes.
DATE    ?= $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
VERSION_PKG := github.com/flotilla-io/flotilla/internal/version
LDFLAGS := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Commit=$(COMMIT) -X $(VERSION_PKG).Date=$(DATE)
GO      ?= go
# Every package's tests, on a 2-core machine within CI's 90 minutes: a
# bound for a hung test, not a target. On a shared machine at load 10
# and more, test/e2e alone took 51 minutes, 60 with an empty cache, so
# the bound leaves it room; CI's 90 minutes still end a run that hangs.
TEST_TIMEOUT ?= 75m
FUZZTIME ?= 30s

IMAGE_TAG ?= flotilla:$(VERSION)

.PHONY: all build docs image release release-test deps kube-binaries coredns flannel helm kube-network-policies prometheus-operator-crds demo test test-only lint generate bench fuzz clean sweep chaos conformance

all: build

# bin/kubectl-flotilla is the same binary as a kubectl plugin: on PATH,
# `kubectl flotilla ...` runs it, and bin/kubectl_complete-flotilla
# completes its words (docs/cli.md). Built as the image
# builds it, without the symbol table and DWARF (a third of its size);
# DEBUG=1 keeps them for a debugger.
BUILDFLAGS := $(if $(DEBUG),,-trimpath)
STRIP      := $(if $(DEBUG),,-s -w)
build:
	$(GO) build $(BUILDFLAGS) -ldflags "$(STRIP) $(LDFLAGS)" -o bin/flotilla ./cmd/flotilla
	ln -sf flotilla bin/kubectl-flotilla
	ln -sf flotilla bin/kubectl_complete-flotilla

# docs/cli.md, the command line reference, from the commands' own help;
# a test of cmd/flotilla fails when it differs.
docs:
	$(GO) run ./cmd/flotilla docs > docs/cli.md.tmp && mv docs/cli.md.tmp docs/cli.md

# The agent's image without a container engine: the static binary on an
# empty base, reproducible (fixed timestamps), as an image tarball that
# `ctr -n k8s.io images import` and `docker load` read.
image:
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/flotilla-linux-amd64 ./cmd/flotilla
	$(GO) run ./hack/image -binary bin/flotilla-linux-amd64 -path /flotilla -tag $(IMAGE_TAG) -o bin/flotilla-image.tar

# A release (docs/release.md): the CLI for linux and darwin on amd64 and
# arm64, the image index (linux/amd64, linux/arm64) as an OCI layout
# archive, deploy/ rendered and the Helm chart packaged with the image
# pinned by digest, the kubectl plugin's archives and krew manifest,
# SHA256SUMS.
# VERSION must be a semantic version (v0.3.0, v0.3.0-rc.1) and the work
# tree clean, unless ALLOW_DIRTY=1. IMAGE_REPO is where the image will be
# pushed, as the manifests name it.
# CLI_PLATFORMS narrows the CLI's platforms (the image's are always built).
# DOWNLOAD_URL is where the release's files will be published (VERSION in
# it is replaced), as the krew manifest names the archives.
RELEASE_DIR ?= bin/release/$(VERSION)
IMAGE_REPO ?= ghcr.io/flotilla-io/flotilla
CLI_PLATFORMS ?= linux/amd64,linux/arm64,darwin/amd64,darwin/arm64
DOWNLOAD_URL ?= https://github.com/flotilla-io/flotilla/releases/download/VERSION
release:
	$(GO) run ./hack/release -version "$(VERSION)" -o "$(RELEASE_DIR)" -image "$(IMAGE_REPO)" -cli-platforms "$(CLI_PLATFORMS)" -download-url "$(DOWNLOAD_URL)" $(if $(filter 1,$(ALLOW_DIRTY)),-allow-dirty)

# `make release` of this checkout, checked as `make test` checks a
# release of a small program (hack/release): behind the build tag
# release, since it builds the whole binary four times.
release-test:
	$(GO) test -tags release -count=1 -timeout 60m -run TestFullRelease -v ./hack/release

# Debian packages, Go modules and the Kubernetes binaries, each only once.
deps:
	bash hack/install-deps.sh

kube-binaries:
	bash hack/build-kube.sh

# The cluster DNS of every test cluster of real nodes, built from
# CoreDNS's module source into the same cache.
coredns:
	bash hack/build-coredns.sh

# flanneld, the CNI of the test clusters that meet a real CNI daemon,
# built from flannel's module source into the same cache.
flannel:
	bash hack/build-flannel.sh

# helm, for the tests that install charts/flotilla with it, built from
# Helm's module source into the same cache.
helm:
	bash hack/build-helm.sh

# kube-network-policies, the NetworkPolicy enforcer of the test clusters
# whose tenants' fences are tried with packets, built from its module
# source into the same cache.
kube-network-policies:
	bash hack/build-kube-network-policies.sh

# Prometheus Operator's CRDs (PodMonitor, ServiceMonitor, PrometheusRule),
# which deploy/monitoring's objects are applied against in its test,
# copied from the operator's module source into the same cache.
prometheus-operator-crds:
	bash hack/fetch-prometheus-operator-crds.sh

# A local federation of real nodes: per cluster a control plane and a
# gateway node, the agent from its image (built from this checkout) by
# kubectl apply -k deploy/. deps installs containerd, runc, the CNI plugins,
# kubelet and kube-proxy.
demo: deps build
	$(GO) run ./test/demo -flotilla bin/flotilla

test: deps lint test-only

# go test through gotestsum (a tool of go.mod): the output of go test,
# then a summary that lists every skipped test with its reason, so a run
# without CI=true that skipped what it lacked does not pass for a full one.
# Packages run TEST_P at a time, the longest first: test/e2e alone
# takes about two thirds of the run, and go test starts packages in the
# order they are named. Two, not more: beside test/e2e's two clusters of
# real nodes (harness.LongRunning's host-wide slots), a third package
# with control planes of its own kept both cores far past busy (load
# average 37), and API calls and kubectl timed out.
# The tests that hold the host alone (harness.HoldNodesAlone: host-wide
# sysctls and the inotify limit) run first, by themselves: among the
# other packages, one of whose tests always holds the host shared, they
# waited until test/e2e ended, and their package's slot with them.
# Every test's result and duration is kept in TEST_JSON
# (`go tool gotestsum tool slowest --jsonfile bin/test.json`).
# The build tag conformance adds TestMCSConformance (test/conformance):
# the MCS API conformance suite's Required label, its reports in
# TEST_CONFORMANCE_REPORT.
# Each of the three runs keeps its events; the last step prints every
# skipped test of all three with its reason (a missing prerequisite
# outside CI), so that a run that skipped something says so at its end.
TEST_P ?= 2
TEST_JSON ?= bin/test.json
TEST_HOLD_JSON ?= bin/test-hold.json
TEST_CHARTS_JSON ?= bin/test-charts.json
TEST_CONFORMANCE_REPORT ?= bin/conformance-required
TEST_FIRST = ./test/e2e ./test/harness ./test/conformance ./agent ./offload/tenancy ./cmd/flotilla ./deploy
HOLD_TESTS = ^(TestRealNodesLeaveNothing|TestNodeStartsWhenInotifyIsScarce|TestControlPlanesStartWhenInotifyIsScarce)$$
test-only:
	mkdir -p $(dir $(TEST_JSON))
	$(GO) tool gotestsum --format standard-quiet --format-hide-empty-pkg --hide-summary skipped --jsonfile $(TEST_HOLD_JSON) -- -count=1 -timeout $(TEST_TIMEOUT) -run '$(HOLD_TESTS)' ./test/harness
	MCS_CONFORMANCE_LABELS=Required FLOTILLA_CONFORMANCE_REPORT="$(abspath $(TEST_CONFORMANCE_REPORT))" \
	  $(GO) tool gotestsum --format standard-quiet --format-hide-empty-pkg --hide-summary skipped --jsonfile $(TEST_JSON) -- -tags conformance -count=1 -p $(TEST_P) -timeout $(TEST_TIMEOUT) -skip '$(HOLD_TESTS)' $(TEST_FIRST) ./...
	$(GO) tool gotestsum --format standard-quiet --hide-summary skipped --jsonfile $(TEST_CHARTS_JSON) --raw-command -- sh -c 'cd charts && $(GO) test -json -count=1 ./...'
	@echo "All three runs (the tests that hold the host, the rest, charts/):"
	@$(GO) tool gotestsum --format pkgname --raw-command -- cat $(TEST_HOLD_JSON) $(TEST_JSON) $(TEST_CHARTS_JSON) | sed -n '/^=== \|^DONE /,$$p'

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags conformance ./test/conformance
	# The CLI builds for macOS too: nothing Linux-only may creep into it.
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./cmd/flotilla
	cd charts && $(GO) vet ./...

# The fault campaign's long form (docs/reliability.md): faults for
# CHAOS_DURATION (default an hour), at most CHAOS_FAULTS of them (0: no
# limit), drawn from CHAOS_SEED (default: the clock; the run prints it),
# on CHAOS_CLUSTERS clusters. `make test` runs the short form: seed 1,
# 3 clusters, 3 faults.
CHAOS_DURATION ?= 1h
CHAOS_FAULTS ?= 0
CHAOS_CLUSTERS ?= 5
CHAOS_SEED ?= $(shell date +%s)
chaos: deps
	FLOTILLA_CHAOS_SEED=$(CHAOS_SEED) FLOTILLA_CHAOS_FAULTS=$(CHAOS_FAULTS) FLOTILLA_CHAOS_DURATION=$(CHAOS_DURATION) FLOTILLA_CHAOS_CLUSTERS=$(CHAOS_CLUSTERS) $(GO) test -count=1 -timeout 3h -run TestChaos -v ./test/chaos

# The upstream MCS API conformance suite (docs/testing.md) against two
# clusters of real nodes with the agents, every label (`make test` runs
# the Required one). MCS_CONFORMANCE is the suite's directory: by default
# the unmodified copy of upstream's tag conformance/v0.5.0 in
# third_party/mcs-conformance. Reports (report.html, report.yaml,
# junit.xml) go to CONFORMANCE_REPORT; CONFORMANCE_LABELS is a Ginkgo
# label filter (default: every label). Behind the build tag conformance:
# `go test ./...` does not build it.
MCS_CONFORMANCE ?= third_party/mcs-conformance
CONFORMANCE_REPORT ?= $(CURDIR)/conformance-report
CONFORMANCE_LABELS ?=
conformance: deps
	MCS_CONFORMANCE="$(abspath $(MCS_CONFORMANCE))" FLOTILLA_CONFORMANCE_REPORT="$(abspath $(CONFORMANCE_REPORT))" MCS_CONFORMANCE_LABELS="$(CONFORMANCE_LABELS)" \
	  $(GO) test -tags conformance -count=1 -timeout 3h -run TestMCSConformance -v ./test/conformance

CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.19.0

# Deep copies and CRD manifests from the Go types in api/.
generate:
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=deploy/crds

# Every benchmark, then one table of their figures against their targets
# and anchors (hack/benchreport), also written into docs/benchmarks.md's
# summary. The machine's load before and after is in the output
# (bin/bench.txt) and beside each figure of the printed table (not in
# docs/). See docs/benchmarks.md for what
# each one measures. BenchmarkExportToDNSConnection reports a median of
# 10 rounds; BenchmarkNamespaceOffloadScale one round per size (1, 5, 10
# and 20 providers, each round of 100 namespaces: a curve, not a
# median; five rounds of each took over half an hour);
# BenchmarkReflectionLag one round of 1000 changes per kind (its p99 is
# over them). The benchmarks whose targets hold under load run quiet
# and with two busy loops (busy-loops=0 and 2, test/busy).
# BENCH_TIMEOUT bounds each package's benchmarks (go test's default, 10
# minutes, is far less than test/e2e's take). Membership runs the anchor
# (memberlist's LAN profile) and ours, not the six timings compared on
# the way to ours (an hour at 5 rounds), and detection as the summary
# reports it: 10 and 100 members in ten processes, two busy loops.
BENCH_PKGS ?= ./test/harness ./ipam/... ./discovery/... ./tunnel/... ./fabric/... ./peering/... ./agent ./policy/... ./offload/... ./observe/... ./cmd/flotilla ./test/e2e
BENCH_TIMEOUT ?= 4h
BENCH_ENV ?= DISCOVERY_BENCH_PROFILES=memberlist-lan,lan DISCOVERY_BENCH_PROCS=10 DISCOVERY_BENCH_BUSY=2 DISCOVERY_BENCH_MEMBERS=10,100
bench: deps
	@mkdir -p bin
	@echo "# load before: $$(cut -d' ' -f1-3 /proc/loadavg)" > bin/bench.txt
	{ $(BENCH_ENV) $(GO) test -run '^$$' -bench . -skip 'BenchmarkExportToDNSConnection|BenchmarkNamespaceOffloadScale|BenchmarkReflectionLag' -benchtime 5x -timeout $(BENCH_TIMEOUT) $(BENCH_PKGS) 2>&1; rc=$$?; \
	  $(GO) test -run '^$$' -bench BenchmarkReflectionLag -benchtime 1x -timeout $(BENCH_TIMEOUT) ./offload/reflection 2>&1 || rc=1; \
	  $(GO) test -run '^$$' -bench BenchmarkNamespaceOffloadScale -benchtime 1x -timeout $(BENCH_TIMEOUT) ./test/e2e 2>&1 || rc=1; \
	  $(GO) test -run '^$$' -bench BenchmarkExportToDNSConnection -benchtime 10x -timeout $(BENCH_TIMEOUT) ./test/e2e 2>&1 || rc=1; echo $$rc > bin/bench.rc; } | tee -a bin/bench.txt
	@echo "# load after: $$(cut -d' ' -f1-3 /proc/loadavg)" >> bin/bench.txt
	$(GO) run ./hack/benchreport -docs docs/benchmarks.md bin/bench.txt
	@exit $$(cat bin/bench.rc)

# Runs every fuzz target for FUZZTIME each.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

# Removes leftovers of killed test runs (namespaces, processes, files).
sweep:
	$(GO) run ./test/harness/sweep

clean:
	rm -rf bin

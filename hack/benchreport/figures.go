package main

// figure is one row of the report: which benchmark's metric is its
// figure, the target it is held to and the anchor that target comes from.
type figure struct {
	// Name is the row's first cell, as docs/benchmarks.md's summary
	// shows it (a link to the benchmark's section).
	Name string
	// Pkg is the package (its import path ends in it) and Bench the
	// benchmark's name as go test prints it, without the -GOMAXPROCS
	// suffix.
	Pkg, Bench string
	// Metric is the unit the benchmark reports the figure in
	// (b.ReportMetric); Min and Max, when set, those of its spread.
	Metric, Min, Max string
	// Unit follows the figure in the table; Scale converts the metric
	// into it (0: 1).
	Unit  string
	Scale float64
	// Target is the figure's target, a ceiling or, with AtLeast, a floor;
	// NoTarget rows have none.
	Target   float64
	AtLeast  bool
	NoTarget bool
	// TargetAlso follows the target in the table: what else it asks that
	// the figure alone does not say (the figure's verdict is on Target).
	TargetAlso string
	// Busy, when set, is the benchmark of the same figure measured with
	// both cores kept busy (its busy-loops=2 level, test/busy): the row
	// shows it after the quiet one, and its verdict says both. BusyTarget
	// is the busy figure's target when it differs from Target; with
	// QuietOnly the busy figure has none (it is shown, not judged).
	Busy       string
	BusyTarget float64
	QuietOnly  bool
	// Anchor names what the target comes from; AnchorValue is its figure
	// in Unit (0: it has none, and the row no ratio).
	Anchor      string
	AnchorValue float64
	// AnchorMetric, when set, is the anchor's figure measured in the same
	// run (the bare path), in Metric's unit.
	AnchorMetric string
	// NotInBench says why `make bench` does not run it; such a row keeps
	// the figure last written.
	NotInBench string
}

const root = "github.com/flotilla-io/flotilla/"

// figures are the report's rows, in docs/benchmarks.md's order.
var figures = []figure{
	{Name: "[peering, start to first packet, 5 clusters](#benchmarkpeeringfirstpacket)",
		Pkg: "test/e2e", Bench: "BenchmarkPeeringFirstPacket/clusters=5/busy-loops=0", Busy: "BenchmarkPeeringFirstPacket/clusters=5/busy-loops=2", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		Target: 1000, Anchor: "Liqo v0.8: 3.81 s ± 0.78 s", AnchorValue: 3810},
	{Name: "[peering, start to first packet, 2 clusters](#benchmarkpeeringfirstpacket)",
		Pkg: "test/e2e", Bench: "BenchmarkPeeringFirstPacket/clusters=2/busy-loops=0", Busy: "BenchmarkPeeringFirstPacket/clusters=2/busy-loops=2", QuietOnly: true, Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		Target: 250, Anchor: "Liqo v0.8: 3.81 s ± 0.78 s", AnchorValue: 3810},
	{Name: "[peering engines alone, 5 clusters](#benchmarkconvergence-peering)",
		Pkg: "peering", Bench: "BenchmarkConvergence/clusters=5", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		NoTarget: true, Anchor: "part of the first packet"},
	{Name: "[per-peer network setup (ledger), 1000 peers](#ipam-benchmarkviews1000onebyone-and-the-others)",
		// One transaction each, synced, as peering gives a peer its views:
		// the batch's figure is not what a peer waits for.
		Pkg: "ipam", Bench: "BenchmarkViews1000OneByOne/fsync", Metric: "ms/peer", Unit: "ms/peer",
		Target: 5, Anchor: "Liqo: 99 ms/peer at 200 peers, its IPAM 3.7 ms of it", AnchorValue: 99},
	{Name: "[per-peer data path setup, 1000 peers](#benchmarkreconcile)",
		Pkg: "tunnel", Bench: "BenchmarkReconcile/from-empty-1000", Metric: "ms/peer", Unit: "ms/peer",
		Target: 5, Anchor: "Liqo: 99 ms/peer at 200 peers", AnchorValue: 99},
	{Name: "[tunnel throughput](#benchmarkdatapath)",
		Pkg: "tunnel", Bench: "BenchmarkDataPath", Metric: "ours/wg-throughput", Unit: "of bare WireGuard",
		Target: 0.9, AtLeast: true, Anchor: "bare userspace WireGuard on the same path", AnchorValue: 1},
	{Name: "[tunnel round trip](#benchmarkdatapath)",
		Pkg: "tunnel", Bench: "BenchmarkDataPath", Metric: "ours/wg-rtt", Unit: "of bare WireGuard",
		Target: 1.1, Anchor: "bare userspace WireGuard on the same path", AnchorValue: 1},
	{Name: "[tunnel under a Go memory limit of 96 MiB](#benchmarktunnelundermemorylimit)",
		Pkg: "test/e2e", Bench: "BenchmarkTunnelUnderMemoryLimit", Metric: "Gbit/s-96MiB", Unit: "Gbit/s",
		NoTarget: true, Anchor: "the same transfer without a limit", AnchorMetric: "Gbit/s-none"},
	{Name: "[agent restart, userspace WireGuard](#benchmarkrestart)",
		Pkg: "tunnel", Bench: "BenchmarkRestart", Metric: "ms-traffic-lost-median", Min: "ms-traffic-lost-min", Max: "ms-traffic-lost-max", Unit: "ms lost",
		NoTarget: true, Anchor: "kernel WireGuard: nothing lost"},
	{Name: "[gossip convergence, 100 members](#benchmarkconvergence-discovery)",
		Pkg: "discovery", Bench: "BenchmarkConvergence/profile=lan/members=100", Metric: "s/converge", Min: "min-s/converge", Max: "max-s/converge", Unit: "s",
		Target: 1, Anchor: "memberlist's stock LAN profile"},
	{Name: "[failure detection, 100 members](#benchmarkdetection)",
		Pkg: "discovery", Bench: "BenchmarkDetection/profile=lan/members=100/procs=10/busy-loops=2", Metric: "s/detect", Min: "min-s/detect", Max: "max-s/detect", Unit: "s",
		Target: 5, TargetAlso: ", none in 20 runs", Anchor: "memberlist's stock LAN profile: 12.3 s", AnchorValue: 12.3},
	{Name: "[failure detection, 10 members](#benchmarkdetection)",
		Pkg: "discovery", Bench: "BenchmarkDetection/profile=lan/members=10/procs=10/busy-loops=2", Metric: "s/detect", Min: "min-s/detect", Max: "max-s/detect", Unit: "s",
		Target: 3, Anchor: "memberlist's stock LAN profile"},
	{Name: "[agent start to first mDNS candidate](#benchmarkstarttofirstmdnscandidate)",
		Pkg: "discovery", Bench: "BenchmarkStartToFirstMDNSCandidate", Metric: "s/first-candidate", Unit: "s",
		Target: 1},
	{Name: "[policy update, 10,000 allowed addresses: one added](#benchmarkpolicyupdate)",
		Pkg: "tunnel", Bench: "BenchmarkPolicyUpdate/one-added-to-10000", Metric: "ms-one-added-median", Min: "ms-one-added-min", Max: "ms-one-added-max", Unit: "ms",
		Target: 2, Anchor: "a socket per operation, as Liqo's ipsets", AnchorValue: 0},
	{Name: "[policy update, 10,000 allowed addresses: one removed](#benchmarkpolicyupdate)",
		Pkg: "tunnel", Bench: "BenchmarkPolicyUpdate/one-added-to-10000", Metric: "ms-one-removed-median", Min: "ms-one-removed-min", Max: "ms-one-removed-max", Unit: "ms",
		Target: 2, Anchor: "a socket per operation: removal 14.5 ms", AnchorValue: 14.5},
	{Name: "[Segregated throughput](#benchmarksegregatedthroughput)",
		Pkg: "tunnel", Bench: "BenchmarkSegregatedThroughput", Metric: "segregated/full", Unit: "of Full",
		Target: 0.95, AtLeast: true, Anchor: "Full mode on the same path", AnchorValue: 1},
	{Name: "[pod address to the gateway's kernel set](#benchmarksegregatedpodtokernel)",
		Pkg: "agent", Bench: "BenchmarkSegregatedPodToKernel", Metric: "median-ms", Min: "min-ms", Max: "max-ms", Unit: "ms",
		NoTarget: true},
	{Name: "[grant to working credential](#benchmarkgranttocredential)",
		Pkg: "test/e2e", Bench: "BenchmarkGrantToCredential/busy-loops=0", Busy: "BenchmarkGrantToCredential/busy-loops=2", Metric: "ms-grant-to-credential", Unit: "ms",
		Target: 100, Anchor: "Liqo v1: `liqoctl peer` with both kubeconfigs"},
	{Name: "[namespace offload](#benchmarknamespaceoffload)",
		Pkg: "test/e2e", Bench: "BenchmarkNamespaceOffload/busy-loops=0", Busy: "BenchmarkNamespaceOffload/busy-loops=2", Metric: "ms-to-ready", Unit: "ms",
		Target: 30, BusyTarget: 100, Anchor: "Liqo v0.8: 0.31 s", AnchorValue: 310},
	{Name: "[100 namespaces to 1 provider](#benchmarknamespaceoffloadscale)",
		Pkg: "test/e2e", Bench: "BenchmarkNamespaceOffloadScale/providers=1", Metric: "ms-per-ns-provider", Unit: "ms per pair",
		NoTarget: true, Anchor: "flat per pair (linear)"},
	{Name: "[100 pods offloaded and reflected](#benchmarkpodoffload)",
		Pkg: "offload/podsync", Bench: "BenchmarkPodOffload/pods=100", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		Target: 2000, Anchor: "Liqo v0.8: 31.9 s", AnchorValue: 31900},
	{Name: "[1000 pods offloaded and reflected](#benchmarkpodoffload)",
		Pkg: "offload/podsync", Bench: "BenchmarkPodOffload/pods=1000", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		Target: 20000, Anchor: "Liqo: no published figure"},
	{Name: "[offloaded pod startup on real kubelets](#benchmarkoffloadedpodstartup)",
		Pkg: "test/e2e", Bench: "BenchmarkOffloadedPodStartup", Metric: "ratio-median", Unit: "of direct",
		Target: 1.2, Anchor: "the same pods started directly", AnchorValue: 1},
	{Name: "[agent memory, 100 peers and 1000 offloaded pods](#benchmarkagentmemory)",
		Pkg: "test/e2e", Bench: "BenchmarkAgentMemory/pods=1000,peers=100", Metric: "MiB-with-pods-working-set", Unit: "MiB working set",
		Target: 64, Anchor: "Liqo users: memory out of hand at 7,000 pods"},
	{Name: "[agent image](#benchmarkagentimagesize)",
		Pkg: "test/harness", Bench: "BenchmarkAgentImageSize", Metric: "MB-binary", Unit: "MB",
		Target: 63.7, Anchor: "the unstripped binary of before: 91 MB", AnchorValue: 91},
	{Name: "[reflection lag, change to effect: ConfigMap](#benchmarkreflectionlag)",
		Pkg: "offload/reflection", Bench: "BenchmarkReflectionLag/ConfigMap/busy-loops=0", Busy: "BenchmarkReflectionLag/ConfigMap/busy-loops=2", Metric: "ms-p99", Unit: "ms p99",
		Target: 25, Anchor: "Liqo: no lag metric"},
	{Name: "[endpoints on a third cluster](#benchmarkthirdclusterendpointslag)",
		Pkg: "offload/reflection", Bench: "BenchmarkThirdClusterEndpointsLag", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		Target: 100},
	{Name: "[MCS export to usable import](#benchmarkexporttoimport)",
		Pkg: "offload/mcs", Bench: "BenchmarkExportToImport", Metric: "median-ms", Min: "min-ms", Max: "max-ms", Unit: "ms",
		Target: 1000, Anchor: "Submariner Lighthouse, Cilium global services"},
	{Name: "[clusterset DNS](#benchmarkclustersetdns)",
		Pkg: "offload/mcsdns", Bench: "BenchmarkClustersetDNS/query", Metric: "us-median", Min: "us-min", Max: "us-max", Unit: "µs a query",
		NoTarget: true},
	{Name: "[export to first DNS-resolved connection, through CoreDNS](#benchmarkexporttodnsconnection)",
		Pkg: "test/e2e", Bench: "BenchmarkExportToDNSConnection", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		Target: 1000},
	{Name: "[new peer to routes on every node, 10 nodes](#benchmarkfabricroutes)",
		Pkg: "test/e2e", Bench: "BenchmarkFabricRoutes", Metric: "ms-routes-after-connected", Unit: "ms after Connected",
		Target: 1000, Anchor: "Liqo's fabric, Submariner's route agent"},
	{Name: "[worker-to-worker throughput](#benchmarkfabricthroughput)",
		Pkg: "test/e2e", Bench: "BenchmarkFabricThroughput", Metric: "ratio-median", Unit: "of gateway-to-gateway",
		Target: 0.9, AtLeast: true, Anchor: "gateway-to-gateway in the same run", AnchorValue: 1},
	{Name: "[gateway node killed to traffic flowing again](#benchmarkgatewayfailover)",
		Pkg: "test/e2e", Bench: "BenchmarkGatewayFailover", Metric: "ms-kill-median", Min: "ms-kill-min", Max: "ms-kill-max", Unit: "ms",
		Target: 2000, Anchor: "Submariner: 15 s before tuning; 10 s lease", AnchorValue: 15000},
	{Name: "[gateway stopped gracefully to traffic flowing again](#benchmarkgatewayfailover)",
		Pkg: "test/e2e", Bench: "BenchmarkGatewayFailover", Metric: "ms-stop-median", Min: "ms-stop-min", Max: "ms-stop-max", Unit: "ms",
		Target: 500, Anchor: "Submariner: a data-path gap on gateway restart"},
	{Name: "[the standby replica at rest, 100 peers, working set](#benchmarkstandbycost)",
		Pkg: "test/e2e", Bench: "BenchmarkStandbyCost/peers=100", Metric: "MiB-standby-working-set", Min: "MiB-standby-working-set-min", Max: "MiB-standby-working-set-max", Unit: "MiB",
		NoTarget: true, Anchor: "the active replica in the same run", AnchorMetric: "MiB-active-working-set"},
	{Name: "[fabric apply on a node, 100 peers](#benchmarkapply)",
		Pkg: "fabric", Bench: "BenchmarkApply/first-100", Metric: "ms/op", Unit: "ms",
		NoTarget: true},
	{Name: "[federation key rotation, 2 clusters](#benchmarkkeyrotate)",
		Pkg: "cmd/flotilla", Bench: "BenchmarkKeyRotate", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		NoTarget: true},
	{Name: "[`flotilla trace`, largest](#operator-tools)",
		Pkg: "observe/trace", Bench: "BenchmarkRun/routes-1000", Metric: "µs-median", Min: "µs-min", Max: "µs-max", Unit: "µs",
		NoTarget: true},
	{Name: "[`flotilla graph`, largest](#operator-tools)",
		Pkg: "observe/graph", Bench: "BenchmarkBuildSVG/clusters-30", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		NoTarget: true},
	{Name: "[the dashboard, largest](#operator-tools)",
		Pkg: "observe/dashboard", Bench: "BenchmarkPage/peers-30", Metric: "µs-median", Min: "µs-min", Max: "µs-max", Unit: "µs",
		NoTarget: true},
	{Name: "[a real cluster's first pod](#test-harness)",
		Pkg: "test/harness", Bench: "BenchmarkRealClusterFirstPod", Metric: "ms-median", Min: "ms-min", Max: "ms-max", Unit: "ms",
		NoTarget: true},
}

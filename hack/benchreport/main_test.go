package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const output = `# load before: 1.10 0.90 0.80
goos: linux
pkg: github.com/flotilla-io/flotilla/test/e2e
BenchmarkNamespaceOffload/busy-loops=0: 7 rounds, NamespaceOffload to Ready      24      20      30 (ms)
BenchmarkNamespaceOffload/busy-loops=0-2   	       7	         0 ns/op	        24.0 ms-to-ready	 31.5 machine-busy-%
BenchmarkNamespaceOffload/busy-loops=2-2   	       7	         0 ns/op	        120 ms-to-ready	 99.6 machine-busy-%
--- SKIP: BenchmarkGrantToCredential
    grants_bench_test.go:28: real nodes: kubelet not installed (make deps)
pkg: github.com/flotilla-io/flotilla/offload/reflection
BenchmarkReflectionLag/ConfigMap/busy-loops=0-2  1  0 ns/op  5.1 ms-median  14.2 ms-p99  40.0 machine-busy-%
pkg: github.com/flotilla-io/flotilla/tunnel
BenchmarkDataPath-2   	1	 9 ns/op	 2.8 ours-Gbit/s	 0.95 ours/wg-throughput	 1.30 ours/wg-rtt
BenchmarkPolicyUpdate/one-added-to-10000-2  5  0 ns/op  1.50 ms-one-added-median  1.0 ms-one-added-min  4.0 ms-one-added-max
pkg: github.com/flotilla-io/flotilla/test/harness
BenchmarkRealClusterFirstPod-2  1  0 ns/op  10900 ms-median
pkg: github.com/flotilla-io/flotilla/peering
BenchmarkConvergence/clusters=5-2  5  0 ns/op  80 ms-median  60 ms-min  120 ms-max
pkg: github.com/flotilla-io/flotilla/discovery
BenchmarkDetection/profile=lan/members=100/procs=10/busy-loops=2-2 	detect-diag: group 0 stalls >= 0.5 s (end relative to watch: length): 
detect-diag: run: detect 4.74s, 0 false deaths
       5	6922995049 ns/op	         4.9 max-s/detect	         4.5 min-s/detect	         4.6 s/detect
# load after: 2.00 1.00 0.90
`

func rowOf(t *testing.T, table, name string) []string {
	t.Helper()
	for _, line := range strings.Split(table, "\n") {
		if c := splitCells(line); len(c) == 6 && c[0] == name {
			return c
		}
	}
	t.Fatalf("no row %s in\n%s", name, table)
	return nil
}

// Each row shows its figure with the load the run stated, its verdict
// against the target and its ratio to the anchor; a skipped benchmark
// says why.
func TestReport(t *testing.T) {
	var out bytes.Buffer
	if err := run("", nil, strings.NewReader(output), &out); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	for _, tc := range []struct {
		name                      string
		figure, target, met, rate string
	}{
		// Quiet and busy: the busy figure follows with how busy the
		// machine was, each held to its own target.
		{"[namespace offload](#benchmarknamespaceoffload)", "24 ms (machine 31.5 % busy); with both cores kept busy (machine 99.6 % busy) 120 ms; load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", "<= 30 ms quiet, <= 100 ms busy", "met quiet; **not met** busy", "0.0774×"},
		{"[reflection lag, change to effect: ConfigMap](#benchmarkreflectionlag)", "14.2 ms p99 (machine 40 % busy); with both cores kept busy: not measured in this run; load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", "<= 25 ms p99, quiet and busy", "met quiet; busy not measured", ""},
		// Skipped in the parent benchmark, before its levels.
		{"[grant to working credential](#benchmarkgranttocredential)", "skipped: real nodes: kubelet not installed (make deps)", "<= 100 ms, quiet and busy", "", ""},
		{"[tunnel throughput](#benchmarkdatapath)", "0.95 of bare WireGuard; load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", ">= 0.9 of bare WireGuard", "met", "0.95×"},
		{"[tunnel round trip](#benchmarkdatapath)", "1.3 of bare WireGuard; load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", "<= 1.1 of bare WireGuard", "**not met**", "1.3×"},
		{"[policy update, 10,000 allowed addresses: one added](#benchmarkpolicyupdate)", "1.5 ms (1 to 4); load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", "<= 2 ms", "met", ""},
		{"[peering engines alone, 5 clusters](#benchmarkconvergence-peering)", "80 ms (60 to 120); load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", "none", "", ""},
		{"[a real cluster's first pod](#test-harness)", "10900 ms; load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", "none", "", ""},
		{"[MCS export to usable import](#benchmarkexporttoimport)", "not measured yet", "<= 1000 ms", "", ""},
		// Its stderr came between its name and its figures.
		{"[failure detection, 100 members](#benchmarkdetection)", "4.6 s (4.5 to 4.9); load before: 1.10 0.90 0.80, load after: 2.00 1.00 0.90", "<= 5 s, none in 20 runs", "met", "0.374×"},
	} {
		c := rowOf(t, table, tc.name)
		if got := []string{c[1], c[2], c[3], c[5]}; strings.Join(got, "|") != strings.Join([]string{tc.figure, tc.target, tc.met, tc.rate}, "|") {
			t.Errorf("%s: figure, target, met, ratio = %q, want %q", tc.name, got, []string{tc.figure, tc.target, tc.met, tc.rate})
		}
	}
}

// Written into a document, the table replaces the one between the
// markers; a row without a figure in this run keeps the one written
// before, and the text around is kept byte for byte.
func TestReportIntoDocs(t *testing.T) {
	name := "[MCS export to usable import](#benchmarkexporttoimport)"
	doc := "# Benchmarks\n\nbefore\n" + beginMarker + "\n" + header +
		"| " + name + " | 119 ms (75 to 481) | <= 1 s | met | Submariner | |\n" +
		"| [namespace offload](#benchmarknamespaceoffload) | 142 ms | <= 30 ms | **not met** | Liqo | 0.46× |\n" +
		endMarker + "\nafter\n"
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	bench := filepath.Join(t.TempDir(), "bench.txt")
	if err := os.WriteFile(bench, []byte(output), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(path, []string{bench}, nil, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	if !strings.HasPrefix(got, "# Benchmarks\n\nbefore\n"+beginMarker+"\n") || !strings.HasSuffix(got, endMarker+"\nafter\n") {
		t.Errorf("the text around the table changed:\n%s", got)
	}
	if c := rowOf(t, got, name); c[1] != "119 ms (75 to 481)" || c[2] != "<= 1000 ms" {
		t.Errorf("a row without a new figure: %q, want the figure kept and the target its own", c)
	}
	if c := rowOf(t, got, "[namespace offload](#benchmarknamespaceoffload)"); c[1] != "24 ms (machine 31.5 % busy); with both cores kept busy (machine 99.6 % busy) 120 ms" || c[3] != "met quiet; **not met** busy" {
		t.Errorf("a row with a new figure: %q, want 24 ms and 120 ms busy (the load stays in the run's output), met quiet only", c)
	}
	// Again: the document reads back as it was written.
	if err := run(path, []string{bench}, nil, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(path); string(again) != got {
		t.Errorf("a second run changed the document:\n%s\nthen\n%s", got, again)
	}
}

// Output that is not go test's, and a document without the markers, are
// refused with what is wrong, and the document is left as it was.
func TestReportRefusesBadInput(t *testing.T) {
	if err := run("", nil, strings.NewReader("pkg: x\nBenchmarkA-2 5 12 ns/op 3\n"), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not value and unit pairs") {
		t.Errorf("odd metrics: %v", err)
	}
	if err := run("", nil, strings.NewReader("BenchmarkA-2 5 twelve ns/op\n"), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `"twelve"`) {
		t.Errorf("a metric that is not a number: %v", err)
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := os.WriteFile(path, []byte("no markers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(path, nil, strings.NewReader(output), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), beginMarker) {
		t.Errorf("a document without markers: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "no markers\n" {
		t.Errorf("the document changed: %q", b)
	}
}

func TestBothVerdicts(t *testing.T) {
	const no = "**not met**"
	for _, tc := range []struct{ quiet, busy, want string }{
		{"met", "met", "met, quiet and busy"},
		{"met", no, "met quiet; **not met** busy"},
		{no, "met", "met busy; **not met** quiet"},
		{no, no, "**not met**, quiet and busy"},
		{no, "", "**not met** quiet; busy not measured"},
	} {
		if got := bothVerdicts(tc.quiet, tc.busy); got != tc.want {
			t.Errorf("bothVerdicts(%q, %q) = %q, want %q", tc.quiet, tc.busy, got, tc.want)
		}
	}
}

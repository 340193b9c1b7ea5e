package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/test/busy"
	"github.com/flotilla-io/flotilla/test/federation"
)

// roundCost is what a round of BenchmarkNamespaceOffloadScale cost: the
// API requests the consumer's and the providers' API servers served (by
// verb and resource, from apiserver_request_total) and the CPU time the
// consumer's and the providers' agents used. Printed per
// namespace-provider pair, it tells work that grows with the providers
// from a machine that is only busier.
type roundCost struct {
	consumerRequests, providerRequests map[string]float64
	consumerCPU, providerCPU           float64 // seconds
	machineCPU                         float64 // seconds busy, every core
	at                                 time.Time
}

// costNow reads the counters of every cluster (cs[0] is the consumer).
func costNow(cs []*federation.Cluster) roundCost {
	c := roundCost{consumerRequests: apiRequests(cs[0]), providerRequests: map[string]float64{}}
	c.consumerCPU = cpuSeconds(cs[0].Agent.Pid())
	c.machineCPU, c.at = busy.Mark().BusySeconds(), time.Now()
	for _, p := range cs[1:] {
		for k, v := range apiRequests(p) {
			c.providerRequests[k] += v
		}
		c.providerCPU += cpuSeconds(p.Agent.Pid())
	}
	return c
}

// idleCost is how many cores the machine keeps busy with the clusters up
// and nothing offloaded: what every second of a round costs besides its
// work.
func idleCost(cs []*federation.Cluster) (cores float64) {
	agents := func() (sum float64) {
		for _, c := range cs {
			sum += cpuSeconds(c.Agent.Pid())
		}
		return sum
	}
	b, a, t := busy.Mark().BusySeconds(), agents(), time.Now()
	time.Sleep(5 * time.Second)
	d := time.Since(t).Seconds()
	cores = (busy.Mark().BusySeconds() - b) / d
	fmt.Fprintf(os.Stdout, "providers=%d: before the round, the machine is busy %.2f cores (the clusters idle, and any other work), the agents %.3f\n",
		len(cs)-1, cores, (agents()-a)/d)
	return cores
}

// printCost prints what happened between before and after, per pair.
// idle is the machine's busy cores before the round: the CPU per pair net
// of it is the work the round added.
func printCost(providers int, idle float64, before, after roundCost) {
	pairs := float64(scaleNamespaces * providers)
	line := func(name string, b, a map[string]float64) {
		var parts []string
		total := 0.0
		for _, k := range slices.Sorted(maps.Keys(a)) {
			d := a[k] - b[k]
			if d/pairs < 0.05 {
				continue
			}
			total += d
			parts = append(parts, fmt.Sprintf("%s %.2f", k, d/pairs))
		}
		fmt.Fprintf(os.Stdout, "providers=%d: %s API server requests per pair: %.2f (%s)\n", providers, name, total/pairs, strings.Join(parts, ", "))
	}
	line("consumer's", before.consumerRequests, after.consumerRequests)
	line("providers'", before.providerRequests, after.providerRequests)
	busy, d := after.machineCPU-before.machineCPU, after.at.Sub(before.at).Seconds()
	fmt.Fprintf(os.Stdout, "providers=%d: CPU per pair: consumer's agent %.2f ms, providers' agents %.2f ms, the machine %.2f ms (busy %.2f cores over the round), %.2f ms net of the idle clusters\n", providers,
		(after.consumerCPU-before.consumerCPU)*1000/pairs, (after.providerCPU-before.providerCPU)*1000/pairs,
		busy*1000/pairs, busy/d, (busy-idle*d)*1000/pairs)
}

// apiRequests reads apiserver_request_total of c's API server, summed by
// verb and resource (with its subresource); nil when it cannot.
func apiRequests(c *federation.Cluster) map[string]float64 {
	kube, err := kubernetes.NewForConfig(c.CP.Config)
	if err != nil {
		return nil
	}
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	s := bufio.NewScanner(strings.NewReader(string(raw)))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line, ok := strings.CutPrefix(s.Text(), "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(line, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for f := range strings.SplitSeq(labels, ",") {
			if k, v, ok := strings.Cut(f, "="); ok {
				l[k] = strings.Trim(v, `"`)
			}
		}
		if l["verb"] == "WATCH" || l["verb"] == "CONNECT" {
			continue
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += v
	}
	return out
}

// cpuSeconds is the user and system time process pid used so far.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command (which may hold spaces) start at state.
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// roundRequests counts what the API servers of a benchmark's clusters
// served over one round, by verb and resource (watches and requests
// without a resource, such as the scrapes themselves, left out): the
// requests of everything on them, the agents' first.
type roundRequests struct {
	names  []string
	before []map[string]float64
}

func startRequests(cs map[string]*federation.Cluster) *roundRequests {
	r := &roundRequests{names: slices.Sorted(maps.Keys(cs))}
	for _, n := range r.names {
		r.before = append(r.before, apiRequests(cs[n]))
	}
	return r
}

// end returns the requests served since start, by "cluster verb
// resource", and their total.
func (r *roundRequests) end(cs map[string]*federation.Cluster) (map[string]int, int) {
	out, total := map[string]int{}, 0
	for i, n := range r.names {
		for k, v := range apiRequests(cs[n]) {
			d := int(v - r.before[i][k])
			if d <= 0 || strings.HasSuffix(k, " ") {
				continue
			}
			out[n+" "+k] += d
			total += d
		}
	}
	return out, total
}

// printRequests writes what end returned, one line per kind.
func printRequests(title string, counts map[string]int, total int) {
	fmt.Fprintf(os.Stdout, "%s: %d requests\n", title, total)
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(os.Stdout, "  %3d  %s\n", counts[k], k)
	}
}

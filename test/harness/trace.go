package harness

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// Trace records the API requests of the clients made from configurations
// it wrapped, for a benchmark's account of one operation: how many
// requests of each verb and resource each side made, how many of them came
// one after another (the sequential depth), and the timeline of requests
// and of the data that arrived on watches, which shows what each step
// waited for. It never records a header or a body.
type Trace struct {
	mu     sync.Mutex
	start  time.Time
	calls  []TracedCall
	events []TracedEvent
}

// TracedCall is one request: who made it, what, and when it was sent and
// answered (offsets from the trace's start).
type TracedCall struct {
	Side, Verb, Resource string
	Start, End           time.Duration
	Code                 int
}

// TracedEvent is data read from a watch: an event, or a few arriving
// together.
type TracedEvent struct {
	Side, Resource string
	At             time.Duration
}

// NewTrace starts a trace; Reset starts it again.
func NewTrace() *Trace { return &Trace{start: time.Now()} }

// Wrap returns a copy of cfg whose clients record their requests as
// side's; cfg's own wrappers run inside.
func (tr *Trace) Wrap(cfg *rest.Config, side string) *rest.Config {
	wrapped := rest.CopyConfig(cfg)
	wrapped.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			verb, resource := verbAndResource(req)
			start := tr.since()
			resp, err := rt.RoundTrip(req)
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			if verb == "watch" {
				if resp != nil && resp.Body != nil {
					resp.Body = &watchBody{ReadCloser: resp.Body, tr: tr, side: side, resource: resource}
				}
				return resp, err
			}
			tr.mu.Lock()
			tr.calls = append(tr.calls, TracedCall{Side: side, Verb: verb, Resource: resource, Start: start, End: tr.sinceLocked(), Code: code})
			tr.mu.Unlock()
			return resp, err
		})
	})
	return wrapped
}

func (tr *Trace) since() time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.sinceLocked()
}

func (tr *Trace) sinceLocked() time.Duration { return time.Since(tr.start) }

// Reset forgets everything recorded and starts the clock again.
func (tr *Trace) Reset() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.start, tr.calls, tr.events = time.Now(), nil, nil
}

// Calls returns the requests recorded since the last Reset, in the order
// they were answered.
func (tr *Trace) Calls() []TracedCall {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.calls)
}

// Counts are the requests recorded since the last Reset, by "side verb
// resource".
func (tr *Trace) Counts() map[string]int {
	out := map[string]int{}
	for _, c := range tr.Calls() {
		out[c.Side+" "+c.Verb+" "+c.Resource]++
	}
	return out
}

// Depth is the longest chain of recorded requests each sent after the one
// before it was answered: the round trips the operation made one after
// another. Requests sent together count once.
func (tr *Trace) Depth() (int, []TracedCall) {
	calls := tr.Calls()
	slices.SortFunc(calls, func(a, b TracedCall) int { return int(a.End - b.End) })
	depth, prev := make([]int, len(calls)), make([]int, len(calls))
	best := -1
	for i, c := range calls {
		depth[i], prev[i] = 1, -1
		for j := range i {
			if calls[j].End <= c.Start && depth[j]+1 > depth[i] {
				depth[i], prev[i] = depth[j]+1, j
			}
		}
		if best < 0 || depth[i] > depth[best] {
			best = i
		}
	}
	if best < 0 {
		return 0, nil
	}
	var chain []TracedCall
	for i := best; i >= 0; i = prev[i] {
		chain = append(chain, calls[i])
	}
	slices.Reverse(chain)
	return depth[best], chain
}

// Report writes the counts, the depth with its chain, and the timeline
// of requests and watch data since the last Reset.
func (tr *Trace) Report(w io.Writer, title string) {
	counts := tr.Counts()
	total := 0
	for _, n := range counts {
		total += n
	}
	fmt.Fprintf(w, "%s: %d requests\n", title, total)
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(w, "  %3d  %s\n", counts[k], k)
	}
	depth, chain := tr.Depth()
	fmt.Fprintf(w, "  sequential depth %d:", depth)
	for _, c := range chain {
		fmt.Fprintf(w, " %s %s %s;", c.Side, c.Verb, c.Resource)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  timeline (ms):\n")
	for _, l := range tr.timeline() {
		fmt.Fprintf(w, "    %s\n", l)
	}
}

func (tr *Trace) timeline() []string {
	tr.mu.Lock()
	calls, events := slices.Clone(tr.calls), slices.Clone(tr.events)
	tr.mu.Unlock()
	type line struct {
		at   time.Duration
		text string
	}
	var lines []line
	ms := func(d time.Duration) string { return fmt.Sprintf("%7.1f", float64(d)/float64(time.Millisecond)) }
	for _, c := range calls {
		lines = append(lines, line{c.Start, fmt.Sprintf("%s-%-7s %-9s %s %s (%d)", ms(c.Start), strings.TrimSpace(ms(c.End)), c.Side, c.Verb, c.Resource, c.Code)})
	}
	for _, e := range events {
		lines = append(lines, line{e.At, fmt.Sprintf("%s         %-9s watch data %s", ms(e.At), e.Side, e.Resource)})
	}
	slices.SortStableFunc(lines, func(a, b line) int { return int(a.at - b.at) })
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.text
	}
	return out
}

// watchEventGap merges the reads of one watch closer together than this
// into one event: a decoder reads an event's frame in more than one
// piece.
const watchEventGap = time.Millisecond

// watchBody records when data arrives on a watch.
type watchBody struct {
	io.ReadCloser
	tr             *Trace
	side, resource string
	last           time.Time
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && time.Since(b.last) > watchEventGap {
		b.last = time.Now()
		b.tr.mu.Lock()
		b.tr.events = append(b.tr.events, TracedEvent{Side: b.side, Resource: b.resource, At: b.tr.sinceLocked()})
		b.tr.mu.Unlock()
	}
	return n, err
}

// verbAndResource names a request as the API server's metrics do: its
// verb (get, list, watch, create, update, patch, apply, delete) and its
// resource with any subresource.
func verbAndResource(req *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	// /api/v1/... or /apis/group/version/...
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return strings.ToLower(req.Method), req.URL.Path
	}
	if len(parts) > 2 && parts[0] == "namespaces" && parts[2] != "status" && parts[2] != "finalize" {
		parts = parts[2:] // namespaced: the resource follows the namespace
	}
	named := len(parts) >= 2
	if len(parts) == 0 {
		return strings.ToLower(req.Method), req.URL.Path
	}
	resource = parts[0]
	if len(parts) >= 3 {
		resource += "/" + parts[2]
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
		if strings.HasPrefix(req.Header.Get("Content-Type"), "application/apply-patch") {
			verb = "apply"
		}
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}

// WaitQuiet waits until the traced clients made no request for 200 ms
// (at most 5 s): what a benchmark's last round still did is not counted
// in the next.
func (t *Trace) WaitQuiet() {
	deadline := time.Now().Add(5 * time.Second)
	seen := -1
	for time.Now().Before(deadline) {
		n := len(t.Calls())
		if n == seen {
			return
		}
		seen = n
		time.Sleep(200 * time.Millisecond)
	}
}

// Median is the middle of xs once sorted (the upper one of an even
// count); zero for none.
func Median[T cmp.Ordered](xs []T) T {
	if len(xs) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// Rounds gathers the rounds of a benchmark that one Trace follows: each
// round's time, how many requests it made and their sequential depth.
type Rounds struct {
	took             []time.Duration
	requests, depths []int
}

// Add records a round that took d, as tr saw it.
func (r *Rounds) Add(tr *Trace, d time.Duration) {
	n := 0
	for _, c := range tr.Counts() {
		n += c
	}
	depth, _ := tr.Depth()
	r.took, r.requests, r.depths = append(r.took, d), append(r.requests, n), append(r.depths, depth)
}

// Report prints every round on w, as name, and reports their medians
// as b's metrics.
func (r *Rounds) Report(w io.Writer, b interface{ ReportMetric(float64, string) }, name string) {
	fmt.Fprintf(w, "%s: %d rounds: requests until Ready %v, sequential depth %v, ms %v\n", name, len(r.took), r.requests, r.depths, r.took)
	b.ReportMetric(float64(Median(r.took))/float64(time.Millisecond), "ms-to-ready")
	b.ReportMetric(float64(Median(r.requests)), "requests")
	b.ReportMetric(float64(Median(r.depths)), "depth")
	b.ReportMetric(0, "ns/op")
}

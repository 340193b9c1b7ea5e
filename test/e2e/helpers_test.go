// Package e2e holds end-to-end tests: real control planes, real network
// sites, real agent processes.
package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// longRunning marks a test that brings up clusters of real nodes and
// runs for minutes: harness.LongRunning (two at a time on the host,
// after the short ones; FLOTILLA_E2E_PARALLEL=0 runs them one by one).
func longRunning(t *testing.T) { harness.LongRunning(t) }

// waitFor polls check until it passes, the process exits, or timeout.
func waitFor(t *testing.T, p *harness.Process, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if exited, werr := p.Exited(); exited {
			t.Fatalf("%s exited (%v) while waiting: %v\n%s", p.Name, werr, err, p.Tail(20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v\n%s", timeout, err, p.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// siteClient is an HTTP client that connects from inside the site. It
// keeps no connection open after a request: each call makes a client of
// its own, whose idle connections would otherwise stay open for the
// test's life, each a goroutine and buffers in the server it polled (30
// in an agent BenchmarkAgentMemory measured).
func siteClient(s *harness.Site) *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return s.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
}

// expectBodyIn GETs url from inside site s and checks for 200 and want.
func expectBodyIn(s *harness.Site, url, want string) error {
	return expectBody(siteClient(s), url, 200, want)
}

// metricAtLeast checks that the sum of a metric's series on the agent in
// site s is at least min.
func metricAtLeast(s *harness.Site, name string, min float64) error {
	body, err := getIn(s, "http://127.0.0.1:9470/metrics")
	if err != nil {
		return err
	}
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	if sum < min {
		return fmt.Errorf("%s is %v, want at least %v", name, sum, min)
	}
	return nil
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// checks holds named readiness checks. A component registers one when it
// starts; /readyz passes when every check passes. A check must answer at
// once: one that can block is a probe's result.
type checks struct {
	mu     sync.RWMutex
	checks map[string]func() error
	// role, when set, follows "ok" in a passing answer: a standby is
	// ready (its process is healthy) and says which role it holds.
	role func() string
}

func (c *checks) setRole(role func() string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.role = role
}

func (c *checks) add(name string, check func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.checks == nil {
		c.checks = map[string]func() error{}
	}
	c.checks[name] = check
}

// run returns one line per check, sorted, and whether all passed.
func (c *checks) run() ([]string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	names := make([]string, 0, len(c.checks))
	for n := range c.checks {
		names = append(names, n)
	}
	sort.Strings(names)
	ok := len(names) > 0 // nothing registered yet: still starting
	lines := make([]string, 0, len(names))
	for _, n := range names {
		if err := c.checks[n](); err != nil {
			ok = false
			lines = append(lines, fmt.Sprintf("[-]%s failed: %v", n, err))
		} else {
			lines = append(lines, fmt.Sprintf("[+]%s ok", n))
		}
	}
	return lines, ok
}

// serveReadyz answers like kube-apiserver's /readyz: "ok", or 503 with the
// failing checks; ?verbose lists every check.
func (c *checks) serveReadyz(w http.ResponseWriter, r *http.Request) {
	lines, ok := c.run()
	c.mu.RLock()
	role := c.role
	c.mu.RUnlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		if len(lines) == 0 {
			lines = []string{"[-]agent starting"}
		}
		fmt.Fprintln(w, strings.Join(lines, "\n"))
		fmt.Fprintln(w, "readyz check failed")
		return
	}
	if _, verbose := r.URL.Query()["verbose"]; verbose {
		fmt.Fprintln(w, strings.Join(lines, "\n"))
		if role != nil {
			fmt.Fprintf(w, "role: %s\n", role())
		}
		fmt.Fprintln(w, "readyz check passed")
		return
	}
	if role != nil {
		fmt.Fprintf(w, "ok: %s", role())
		return
	}
	fmt.Fprint(w, "ok")
}

// probe runs a check in the background and keeps its last result, so a
// readiness check answers at once from what is known even while the check
// blocks (the tunnel's Status waits for a whole apply). A check that has
// not answered within timeout counts as failed.
type probe struct {
	check func(ctx context.Context) error
	// interval between checks; untilUp between checks before the first
	// success, so readiness comes quickly at start.
	interval, untilUp time.Duration
	timeout           time.Duration
	// changed is told the first result and every change between passing
	// and failing (for a log line and a gauge).
	changed func(err error)
	now     func() time.Time

	mu     sync.Mutex
	last   error
	probed bool
	everUp bool
	since  time.Time // when the check in flight began; zero when idle
}

func newProbe(check func(ctx context.Context) error, interval, timeout time.Duration) *probe {
	return &probe{check: check, interval: interval, untilUp: interval, timeout: timeout, now: time.Now, last: errors.New("not checked yet")}
}

// run checks until ctx ends.
func (p *probe) run(ctx context.Context) error {
	for {
		p.once(ctx)
		wait := p.interval
		p.mu.Lock()
		if !p.everUp {
			wait = p.untilUp
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func (p *probe) once(ctx context.Context) {
	p.mu.Lock()
	p.since = p.now()
	p.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	err := p.check(cctx)
	cancel()
	if ctx.Err() != nil {
		return // stopping: keep the last real answer
	}
	p.mu.Lock()
	changed := !p.probed || (p.last == nil) != (err == nil)
	p.last, p.probed, p.since = err, true, time.Time{}
	if err == nil {
		p.everUp = true
	}
	p.mu.Unlock()
	if changed && p.changed != nil {
		p.changed(err)
	}
}

// result is the last answer, or a failure when the check in flight has
// run past its timeout.
func (p *probe) result() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.since.IsZero() {
		if d := p.now().Sub(p.since); d >= p.timeout {
			return fmt.Errorf("no answer for %s", d.Round(time.Second))
		}
	}
	return p.last
}

package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// readyz asks the checks as kubelet would and returns the status and body;
// it fails the test if the answer does not come (the handler blocked).
func readyz(t *testing.T, c *checks) (int, string) {
	t.Helper()
	type answer struct {
		code int
		body string
	}
	got := make(chan answer, 1)
	go func() {
		rec := httptest.NewRecorder()
		c.serveReadyz(rec, httptest.NewRequest(http.MethodGet, "/readyz?verbose", nil))
		got <- answer{rec.Code, rec.Body.String()}
	}()
	select {
	case a := <-got:
		return a.code, a.body
	case <-time.After(30 * time.Second):
		t.Fatal("/readyz did not answer: it waits for a check")
		return 0, ""
	}
}

// /readyz answers from the last result while the tunnel is busy (its
// Status waits for an apply that holds the tunnel's lock), and fails only
// once the tunnel has not answered for the probe's timeout.
func TestReadinessAnswersWhileTheTunnelIsBusy(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	applying := make(chan struct{}) // held like the tunnel's lock during an apply
	entered := make(chan struct{}, 16)
	calls := 0
	status := func(context.Context) error {
		calls++
		if calls > 1 {
			entered <- struct{}{}
			<-applying
		}
		return nil
	}
	p := newProbe(status, time.Hour, 15*time.Second)
	p.now = clock.Now
	var c checks
	c.add("tunnel", p.result)

	if code, body := readyz(t, &c); code != http.StatusServiceUnavailable || !strings.Contains(body, "not checked yet") {
		t.Fatalf("before the first answer: %d %q, want 503 not checked yet", code, body)
	}
	p.once(context.Background()) // the device answers
	if code, body := readyz(t, &c); code != http.StatusOK {
		t.Fatalf("after an answer: %d %q, want 200", code, body)
	}

	done := make(chan struct{})
	go func() { defer close(done); p.once(context.Background()) }()
	<-entered // the check now waits for the apply
	t.Cleanup(func() { close(applying); <-done })
	if code, body := readyz(t, &c); code != http.StatusOK {
		t.Fatalf("while the tunnel applies: %d %q, want 200 from the last answer", code, body)
	}
	clock.Add(15 * time.Second)
	code, body := readyz(t, &c)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]tunnel failed: no answer for 15s") {
		t.Fatalf("after the timeout: %d %q, want 503 naming the tunnel", code, body)
	}
}

// A probe tells of its first result and of every change, not of repeats.
func TestProbeReportsChanges(t *testing.T) {
	results := []error{errors.New("refused"), errors.New("refused"), nil, nil, errors.New("timeout")}
	i := 0
	p := newProbe(func(context.Context) error { err := results[i]; i++; return err }, time.Hour, time.Hour)
	var told []string
	p.changed = func(err error) {
		if err != nil {
			told = append(told, err.Error())
		} else {
			told = append(told, "ok")
		}
	}
	for range results {
		p.once(context.Background())
	}
	if got, want := strings.Join(told, ","), "refused,ok,timeout"; got != want {
		t.Fatalf("told %s, want %s", got, want)
	}
}

package ctrl

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
)

// passes counts the reconciles of each key and fails a key as many
// times as told first.
type passes struct {
	mu    sync.Mutex
	n     map[string]int
	fails map[string]int
	after map[string]time.Duration
}

func (p *passes) reconcile(_ context.Context, key string) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n[key]++
	if p.fails[key] > 0 {
		p.fails[key]--
		return 0, errors.New("the server said no")
	}
	after := p.after[key]
	delete(p.after, key)
	return after, nil
}

func (p *passes) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[key]
}

func run(t *testing.T, c *Controller[string], cacheErr <-chan error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cacheErr) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestControllerRetriesRequeuesAndCounts(t *testing.T) {
	p := &passes{n: map[string]int{}, fails: map[string]int{"a": 2}, after: map[string]time.Duration{"b": 20 * time.Millisecond}}
	reg := prometheus.NewRegistry()
	logs := &syncbuf.Buffer{}
	c, err := New(Config[string]{
		Name: "test_things", Workers: 2, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond,
		Reconcile: p.reconcile, Metrics: reg,
		Errors: &ErrorLog[string]{
			Logger: slog.New(slog.NewTextHandler(logs, nil)), Failed: "thing not reconciled; retrying", Recovered: "thing reconciled again",
			Attrs: func(k string) []any { return []any{"thing", k} },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c, nil)
	c.Add("a")
	c.Add("b")
	// a fails twice, then succeeds: three passes; b asks to be looked at
	// again: two passes.
	eventually.Within(t, 5*time.Second, "a retried until it succeeds", func() error {
		if n := p.count("a"); n != 3 {
			return errors.New(strings.Repeat("pass ", n))
		}
		return nil
	})
	eventually.Within(t, 5*time.Second, "b requeued after its delay", func() error {
		if n := p.count("b"); n != 2 {
			return errors.New(strings.Repeat("pass ", n))
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The same error twice is logged once; its clearing once.
	out := logs.String()
	if n := strings.Count(out, "thing not reconciled; retrying"); n != 1 {
		t.Errorf("the repeated error logged %d times, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "thing reconciled again"); n != 1 {
		t.Errorf("the recovery logged %d times, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "thing=a") || !strings.Contains(out, "the server said no") {
		t.Errorf("the log does not name the key and its error:\n%s", out)
	}
	for _, want := range []struct {
		metric string
		labels []string
		value  float64
	}{
		{"flotilla_controller_reconciles_total", []string{"test_things", "error"}, 2},
		{"flotilla_controller_reconciles_total", []string{"test_things", "success"}, 3},
		// Two backoffs of a and the delay b asked for.
		{"flotilla_workqueue_retries_total", []string{"test_things"}, 3},
	} {
		got := 0.0
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != want.metric {
				continue
			}
			for _, m := range mf.GetMetric() {
				match := true
				for i, l := range m.GetLabel() {
					if i < len(want.labels) && l.GetValue() != want.labels[i] {
						match = false
					}
				}
				if match {
					got += m.GetCounter().GetValue()
				}
			}
		}
		if got != want.value {
			t.Errorf("%s%v = %v, want %v", want.metric, want.labels, got, want.value)
		}
	}
}

// Two controllers of one process register on one registry, and each has
// its own series.
func TestControllersShareTheRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, name := range []string{"one", "two"} {
		p := &passes{n: map[string]int{}}
		c, err := New(Config[string]{Name: name, Reconcile: p.reconcile, Metrics: reg})
		if err != nil {
			t.Fatalf("controller %s: %v", name, err)
		}
		stop := run(t, c, nil)
		c.Add("k")
		eventually.Within(t, 5*time.Second, name+" reconciled", func() error {
			if p.count("k") != 1 {
				return errors.New("not yet")
			}
			return nil
		})
		_ = stop()
	}
	if n := testutil.CollectAndCount(reg, "flotilla_workqueue_adds_total"); n != 2 {
		t.Errorf("flotilla_workqueue_adds_total has %d series, want one per controller (2)", n)
	}
}

// A cache that stops with an error stops the controller with it, named.
func TestControllerStopsWithItsCache(t *testing.T) {
	c, err := New(Config[string]{Name: "watcher", Reconcile: (&passes{n: map[string]int{}}).reconcile})
	if err != nil {
		t.Fatal(err)
	}
	cacheErr := make(chan error, 1)
	cacheErr <- errors.New("the watch ended")
	err = c.Run(context.Background(), cacheErr)
	if err == nil || !strings.Contains(err.Error(), "watcher: watch: the watch ended") {
		t.Fatalf("Run = %v, want the cache's error named by the controller", err)
	}
	// Its queue is shut down: a worker would find nothing more.
	if !c.Queue().ShuttingDown() {
		t.Error("the queue is still open after Run returned")
	}
}

// fixedDelay is a rate limiter that holds every failed key for delay and
// counts the keys it was asked about.
type fixedDelay struct {
	delay time.Duration
	mu    sync.Mutex
	asked int
}

func (f *fixedDelay) When(string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return f.delay
}
func (f *fixedDelay) Forget(string)          {}
func (f *fixedDelay) NumRequeues(string) int { return 0 }

// A controller given a rate limiter retries a failed key when the
// limiter says, not after BaseDelay.
func TestControllerRetriesWhenItsRateLimiterSays(t *testing.T) {
	limiter := &fixedDelay{delay: 150 * time.Millisecond}
	p := &passes{n: map[string]int{}, fails: map[string]int{"a": 2}}
	c, err := New(Config[string]{
		Name: "limited", BaseDelay: time.Millisecond, MaxDelay: time.Millisecond,
		RateLimiter: limiter, Reconcile: p.reconcile,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c, nil)
	start := time.Now()
	c.Add("a")
	eventually.Within(t, 5*time.Second, "a retried until it succeeds", func() error {
		if n := p.count("a"); n != 3 {
			return errors.New(strings.Repeat("pass ", n))
		}
		return nil
	})
	if took := time.Since(start); took < 2*limiter.delay {
		t.Errorf("two retries took %v, want at least the limiter's two delays (%v)", took, 2*limiter.delay)
	}
	_ = stop()
	limiter.mu.Lock()
	defer limiter.mu.Unlock()
	if limiter.asked != 2 {
		t.Errorf("the limiter was asked %d times, want once per failure (2)", limiter.asked)
	}
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	if _, err := New(Config[string]{Name: "nothing"}); err == nil {
		t.Error("a controller without a reconcile was made")
	}
}

// Register registers every collector, says which failed, and takes a
// nil registry as none.
func TestRegister(t *testing.T) {
	if err := Register(nil, prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})); err != nil {
		t.Errorf("Register(nil) = %v, want nil", err)
	}
	reg := prometheus.NewRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	if err := Register(reg, a); err != nil {
		t.Fatal(err)
	}
	// a again fails; b is registered all the same.
	if err := Register(reg, a, b); err == nil {
		t.Error("registering a twice passed")
	}
	b.Inc()
	if n := testutil.CollectAndCount(reg, "b_total"); n != 1 {
		t.Errorf("b_total has %d series after a failed beside it, want 1", n)
	}
}

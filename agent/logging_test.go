package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/harness"
)

// testBinaryStart is no earlier than controller-runtime's own start time,
// from which it counts the 30 s after which it complains.
var testBinaryStart = time.Now()

// recorder is a slog handler that keeps every record, at every level,
// with the attributes added on the way.
type recorder struct {
	mu    *sync.Mutex
	recs  *[]map[string]string
	attrs []slog.Attr
}

func newRecorder() *recorder {
	return &recorder{mu: &sync.Mutex{}, recs: &[]map[string]string{}}
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{"msg": rec.Message, "level": rec.Level.String()}
	for _, a := range r.attrs {
		m[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.recs = append(*r.recs, m)
	return nil
}

func (r *recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(append([]slog.Attr{}, r.attrs...), attrs...)
	return &c
}

func (r *recorder) WithGroup(string) slog.Handler { return r }

// find returns the first record that has every key and value of want
// (a value ending in "*" matches as a prefix).
func (r *recorder) find(want map[string]string) (map[string]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range *r.recs {
		ok := true
		for k, v := range want {
			got, has := m[k]
			if p, prefix := strings.CutSuffix(v, "*"); !has || (prefix && !strings.HasPrefix(got, p)) || (!prefix && got != v) {
				ok = false
				break
			}
		}
		if ok {
			return m, true
		}
	}
	return nil, false
}

// captureStderr sends what the process writes to os.Stderr to a buffer
// too; the returned function restores os.Stderr and returns the text.
func captureStderr(t *testing.T) func() string {
	orig := os.Stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(io.MultiWriter(&buf, orig), r); close(copied) }()
	os.Stderr = w
	var once sync.Once
	restore := func() string {
		once.Do(func() {
			os.Stderr = orig
			w.Close()
			<-copied
			r.Close()
		})
		return buf.String()
	}
	t.Cleanup(func() { restore() })
	return restore
}

// The Kubernetes libraries log into the agent's log, tagged
// component=kubernetes: client-go through klog, controller-runtime through
// its own logger, which then never prints its "SetLogger was never called"
// stack trace.
func TestKubernetesLogsReachTheAgentLog(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("logs", harness.ControlPlaneOptions{})
	stderr := captureStderr(t)
	// controller-runtime complains at the first use of its logger 30 s
	// after the process started: begin after that, or the absence of
	// its complaint below would prove nothing.
	if wait := 31*time.Second - time.Since(testBinaryStart); wait > 0 {
		t.Logf("waiting %s for controller-runtime's 30 s", wait.Round(time.Second))
		time.Sleep(wait)
	}

	rec := newRecorder()
	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.StateDir, cfg.MetricsAddr, cfg.Logger = cp.Kubeconfig, t.TempDir(), "", slog.New(rec)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The agent's Kubernetes side: its CRD, its Node informer (client-go)
	// and a Peer informer as the peering adapter runs it (controller-runtime).
	a.start = func(ctx context.Context, comps *components) error {
		if err := installCRDs(ctx, a.restCfg); err != nil {
			return err
		}
		if _, err := a.watchNodes(ctx, comps, func() {}); err != nil {
			return err
		}
		peers, err := cache.New(a.restCfg, cache.Options{Scheme: peerapi.Scheme()})
		if err != nil {
			return err
		}
		if _, err := peers.GetInformer(ctx, &v1alpha1.Peer{}); err != nil {
			return err
		}
		comps.Go("Peer informer", peers.Start)
		if !peers.WaitForCacheSync(ctx) {
			return fmt.Errorf("Peers not synced")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })

	for _, want := range []map[string]string{
		// client-go's reflector, through klog
		{"component": "kubernetes", "msg": "Caches populated", "type": "*v1.Node"},
		// client-go's sync wait, at info
		{"component": "kubernetes", "msg": "Caches are synced", "informer": "Nodes", "level": "INFO"},
		// the reflector again, through controller-runtime's logger
		{"component": "kubernetes", "msg": "Caches populated", "type": "*v1alpha1.Peer", "logger": "controller-runtime*"},
	} {
		waitUntil(t, fmt.Sprintf("a record %v in the agent's log", want), func() error {
			if _, ok := rec.find(want); !ok {
				return fmt.Errorf("not there")
			}
			return nil
		})
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	ran <- nil // for the cleanup
	if out := stderr(); strings.Contains(out, "was never called") {
		t.Fatalf("controller-runtime complained on stderr:\n%s", out)
	}
}

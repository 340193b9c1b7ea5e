package ha

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/eventually"
)

// blindWatches ends the watches open when it is blinded, and answers the
// requests that open one with 429 Too Many Requests while blind: an
// informer whose watch is down, retried after a backoff that grows to a
// minute, while lists go through (an API server that answers again).
type blindWatches struct {
	next    http.RoundTripper
	blind   atomic.Bool
	mu      sync.Mutex
	open    []context.CancelFunc
	refused atomic.Int32
}

func (b *blindWatches) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Query().Get("watch") != "true" {
		return b.next.RoundTrip(r)
	}
	if b.blind.Load() {
		b.refused.Add(1)
		return &http.Response{StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Header: http.Header{},
			Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}
	ctx, cancel := context.WithCancel(r.Context())
	b.mu.Lock()
	b.open = append(b.open, cancel)
	b.mu.Unlock()
	return b.next.RoundTrip(r.WithContext(ctx))
}

func (b *blindWatches) set(blind bool) {
	b.blind.Store(blind)
	if !blind {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, cancel := range b.open {
		cancel()
	}
	b.open = nil
}

// A pod made while the informer's watch is down is counted from Replicas'
// own lists, not a backoff later; once the informer has caught up, the
// lists are dropped, and a pod deleted is no longer counted.
func TestReplicasSeeAPodWhileTheWatchIsDown(t *testing.T) {
	cp, admin := leaseControlPlane(t)
	pods := admin.CoreV1().Pods(namespace)
	makePod := func(name string) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "flotilla"}}},
		}
		if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	makePod("a1")

	net := &blindWatches{}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { net.next = rt; return net }
	log := &syncBuffer{}
	r := NewReplicas(kubernetes.NewForConfigOrDie(cfg), namespace, "a1", 200*time.Millisecond, slog.New(slog.NewTextHandler(log, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	gauge := r.Collectors()[0]

	eventually.Within(t, 30*time.Second, "alone, as logged", func() error {
		if !strings.Contains(log.String(), `msg="agent replicas that could take the Lease" others=""`) {
			return fmt.Errorf("log:\n%s", log)
		}
		return nil
	})
	if r.Others() {
		t.Fatal("another replica counted where there is none")
	}

	net.set(true)
	eventually.Within(t, 30*time.Second, "the informer's watch down", func() error {
		if r.isWatching() || net.refused.Load() == 0 {
			return fmt.Errorf("watching %v, watches refused %d", r.isWatching(), net.refused.Load())
		}
		return nil
	})
	makePod("a2")
	eventually.Within(t, 30*time.Second, "the pod made while the watch is down counted", func() error {
		if !r.Others() || !strings.Contains(log.String(), "others=a2") {
			return fmt.Errorf("others %v; log:\n%s", r.Others(), log)
		}
		return nil
	})
	if _, held, err := r.inf.GetStore().GetByKey(namespace + "/a2"); err != nil || held {
		t.Fatalf("the informer holds a2 (%v, %v): the test did not keep its watch down", held, err)
	}
	if v := testutil.ToFloat64(gauge); v != 1 {
		t.Fatalf("flotilla_gateway_other_replicas %v, want 1", v)
	}

	net.set(false)
	eventually.Within(t, 2*time.Minute, "the informer caught up, the list dropped", func() error {
		_, held, err := r.inf.GetStore().GetByKey(namespace + "/a2")
		r.others()
		r.mu.Lock()
		listed := r.listed != nil
		r.mu.Unlock()
		if err != nil || !held || listed {
			return fmt.Errorf("the informer holds a2: %v (%v); a list kept: %v", held, err, listed)
		}
		return nil
	})
	if !r.Others() {
		t.Fatal("a2 not counted once the informer holds it")
	}

	if err := pods.Delete(t.Context(), "a2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "the deleted pod no longer counted", func() error {
		if r.Others() || !strings.HasSuffix(strings.TrimSpace(log.String()), `others=""`) {
			return fmt.Errorf("others %v; log:\n%s", r.Others(), log)
		}
		return nil
	})
}

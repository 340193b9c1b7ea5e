package ha

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// cuttable fails every request while cut: a replica partitioned from its
// API server.
type cuttable struct {
	next http.RoundTripper
	cut  atomic.Bool
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("partitioned from the API server (test)")
	}
	return c.next.RoundTrip(r)
}

// syncBuffer is a log both the test and a replica use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// candidate is one replica campaigning: when it became active, when it
// was fenced, and whether the Lease was someone else's or expired then.
type candidate struct {
	e        *Elector
	net      *cuttable
	log      *syncBuffer
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned, with err
	err      error
	active   atomic.Bool
	fenced   chan string // what the Lease said when fenced ran
	activeAt chan struct{}
}

func campaign(t *testing.T, cp *harness.ControlPlane, admin kubernetes.Interface, name string) *candidate {
	t.Helper()
	c := &candidate{net: &cuttable{}, log: &syncBuffer{}, done: make(chan struct{}), fenced: make(chan string, 1), activeAt: make(chan struct{})}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { c.net.next = rt; return c.net }
	c.e = &Elector{
		Kube: kubernetes.NewForConfigOrDie(cfg), Namespace: namespace, Identity: NewIdentity(name),
		Log: slog.New(slog.NewTextHandler(c.log, nil)),
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		c.err = c.e.Run(ctx, func(context.Context) {
			c.active.Store(true)
			close(c.activeAt)
		}, func() {
			c.active.Store(false)
			c.fenced <- leaseState(admin, c.e.Identity)
		})
	}()
	t.Cleanup(func() {
		cancel()
		c.net.cut.Store(false)
		<-c.done
	})
	return c
}

// leaseState says whether the Lease would let another replica act: held
// by another, released, or expired; "still mine" otherwise.
func leaseState(admin kubernetes.Interface, me string) string {
	l, err := admin.CoordinationV1().Leases(namespace).Get(context.Background(), LeaseName, metav1.GetOptions{})
	switch {
	case err != nil:
		return "unreadable: " + err.Error()
	case l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "":
		return "released"
	case *l.Spec.HolderIdentity != me:
		return "held by another"
	case l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
		time.Since(l.Spec.RenewTime.Time) >= time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second:
		return "expired"
	}
	return "still mine"
}

func waitActive(t *testing.T, c *candidate, what string) {
	t.Helper()
	select {
	case <-c.activeAt:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not become active; its log:\n%s", what, c.log)
	}
}

// One replica at a time is active. One partitioned from the API server
// keeps its role until the other holds the Lease or the Lease expired,
// then is fenced; one stopped releases the Lease, and the other takes
// over at once.
func TestLease(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("cp", harness.ControlPlaneOptions{})
	admin := cp.Client
	if _, err := admin.CoreV1().Namespaces().Create(t.Context(), namespaceObject(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	first := campaign(t, cp, admin, "gw1")
	waitActive(t, first, "the first replica")
	second := campaign(t, cp, admin, "gw2")
	// The witness: the second replica read the Lease and saw the first.
	eventually.Within(t, 30*time.Second, "the standby saw the active replica", func() error {
		if !strings.Contains(second.log.String(), "active replica") || !strings.Contains(second.log.String(), first.e.Identity) {
			return fmt.Errorf("standby's log:\n%s", second.log)
		}
		return nil
	})
	if second.active.Load() {
		t.Fatal("two replicas active at once")
	}
	if a, _ := second.e.Active(); a {
		t.Fatal("the standby says it is active")
	}

	t.Run("partitioned active is fenced once the standby may act", func(t *testing.T) {
		cut := time.Now()
		first.net.cut.Store(true)
		waitActive(t, second, "the standby")
		t.Logf("the standby active %.2fs after the active was partitioned from the API server", time.Since(cut).Seconds())
		select {
		case got := <-first.fenced:
			if got == "still mine" {
				t.Fatalf("the partitioned replica was fenced while the Lease was still its own")
			}
			t.Logf("fenced when the Lease was %s", got)
		case <-time.After(60 * time.Second):
			t.Fatalf("the partitioned replica was not fenced; its log:\n%s", first.log)
		}
		<-first.done
		if first.err != nil {
			t.Fatal(first.err)
		}
		if a, _ := first.e.Active(); a {
			t.Fatal("the fenced replica says it is active")
		}
	})

	t.Run("a stopped active releases the Lease", func(t *testing.T) {
		third := campaign(t, cp, admin, "gw3")
		eventually.Within(t, 30*time.Second, "the new standby saw the active replica", func() error {
			if !strings.Contains(third.log.String(), second.e.Identity) {
				return fmt.Errorf("standby's log:\n%s", third.log)
			}
			return nil
		})
		stop := time.Now()
		second.cancel()
		defer func() { t.Logf("the standby active %.2fs after the active stopped", time.Since(stop).Seconds()) }()
		if got := <-second.fenced; got != "released" && got != "held by another" {
			t.Fatalf("the stopped replica was fenced with the Lease %s, want released", got)
		}
		waitActive(t, third, "the standby after a release")
	})
}

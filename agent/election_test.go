package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// agentReadyz returns the agent's /readyz status and body.
func agentReadyz(a *Agent) (int, string, error) {
	resp, err := http.Get("http://" + a.MetricsAddr() + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// With --leader-elect, of two replicas only the one holding the Lease
// starts its components and labels its pod active; the other is ready
// (its process is healthy), says standby on /readyz and its pod carries
// no role label. When the active one stops it releases the Lease and
// takes its label off, and the standby starts, labels its own pod and
// records an Event on it.
func TestLeaderElectStartsOnlyTheActive(t *testing.T) {
	cp, pods := electionPlane(t)
	labelled := func(want ...string) error {
		list, err := pods.List(t.Context(), metav1.ListOptions{LabelSelector: ha.RoleLabel + "=" + ha.RoleActive})
		if err != nil {
			return err
		}
		var got []string
		for _, p := range list.Items {
			got = append(got, p.Name)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("pods labelled %s=%s: %v, want %v", ha.RoleLabel, ha.RoleActive, got, want)
		}
		return nil
	}
	run := func(node string) *replica { return runReplica(t, cp, node, nil, nil) }
	waitStarted := func(r *replica, what string) { t.Helper(); r.waitStarted(t, what) }

	first := run("gw1")
	waitStarted(first, "the first replica")
	second := run("gw2")
	eventually.Within(t, 30*time.Second, "the second replica saw the active one", func() error {
		if !strings.Contains(second.log.String(), "active replica") {
			return fmt.Errorf("its log:\n%s", second.log)
		}
		return nil
	})
	select {
	case <-second.started:
		t.Fatal("the standby started its components while the other replica is active")
	default:
	}
	// Its API server check runs on its own schedule: the first may not
	// have come yet when the standby logs that it saw the active one.
	eventually.Within(t, 10*time.Second, "the standby ready, saying standby", func() error {
		if code, body, err := agentReadyz(second.a); err != nil || code != http.StatusOK || body != "ok: standby" {
			return fmt.Errorf("standby's /readyz: %d %q %v", code, body, err)
		}
		return nil
	})
	eventually.Within(t, 30*time.Second, "the active replica's pod labelled", func() error { return labelled("agent-gw1") })

	first.cancel()
	if err := <-first.ran; err != nil {
		t.Fatalf("the first replica stopped with %v", err)
	}
	first.ran <- nil // for its cleanup
	waitStarted(second, "the standby after the active one stopped")
	eventually.Within(t, 30*time.Second, "the new active replica ready", func() error {
		code, body, err := agentReadyz(second.a)
		if err != nil || code != http.StatusOK || body != "ok: active" {
			return fmt.Errorf("%d %s %v", code, body, err)
		}
		return nil
	})
	eventually.Within(t, 30*time.Second, "the label moved to the new active replica's pod", func() error { return labelled("agent-gw2") })
	eventually.Within(t, 30*time.Second, "an Event says the replica on gw2 took over", func() error {
		evs, err := cp.Client.CoreV1().Events("flotilla-system").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=agent-gw2,reason=" + ha.EventTookOver})
		if err != nil {
			return err
		}
		if len(evs.Items) != 1 || !strings.Contains(evs.Items[0].Message, "on node gw2") {
			return fmt.Errorf("events %+v, want one saying it runs the data path on node gw2", evs.Items)
		}
		return nil
	})
	mfs, err := second.a.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "flotilla_gateway_active" && mf.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Fatalf("flotilla_gateway_active %v on the active replica", mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	l, err := cp.Client.CoordinationV1().Leases("flotilla-system").Get(t.Context(), ha.LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || !strings.HasPrefix(*l.Spec.HolderIdentity, "gw2_") {
		t.Fatalf("Lease %v %v, want held by gw2", l.Spec.HolderIdentity, err)
	}
}

// electionPlane is a control plane with the agent's namespace and the
// pods of two replicas, on nodes gw1 and gw2.
func electionPlane(t *testing.T) (*harness.ControlPlane, typedcorev1.PodInterface) {
	t.Helper()
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("elect", harness.ControlPlaneOptions{})
	if _, err := cp.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := cp.Client.CoreV1().Pods("flotilla-system")
	for _, name := range []string{"agent-gw1", "agent-gw2"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "flotilla"}}},
		}
		if _, err := pods.Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return cp, pods
}

// replica is one agent replica with --leader-elect, its components a
// stand-in.
type replica struct {
	a       *Agent
	log     *syncLog
	started chan struct{}
	cancel  context.CancelFunc
	ran     chan error
}

// runReplica runs a replica on node; its start, once it holds the Lease,
// runs start (when set) and then says it started. tweak, when set, sees
// the agent before it runs.
func runReplica(t *testing.T, cp *harness.ControlPlane, node string, start func(context.Context, *components) error, tweak func(*Agent)) *replica {
	t.Helper()
	r := &replica{log: &syncLog{}, started: make(chan struct{}), ran: make(chan error, 1)}
	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.StateDir, cfg.MetricsAddr = cp.Kubeconfig, t.TempDir(), "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(r.log, nil))
	cfg.LeaderElect, cfg.NodeName, cfg.Namespace, cfg.PodName = true, node, "flotilla-system", "agent-"+node
	// Both replicas share this network namespace: one heartbeat port
	// would not do for two.
	cfg.HeartbeatPort = 0
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.start = func(ctx context.Context, comps *components) error {
		if start != nil {
			if err := start(ctx, comps); err != nil {
				return err
			}
		}
		close(r.started)
		return nil
	}
	if tweak != nil {
		tweak(a)
	}
	r.a = a
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.ran <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-r.ran })
	return r
}

func (r *replica) waitStarted(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.started:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start; its log:\n%s", what, r.log)
	}
}

// syncLog is a log a replica writes while the test reads it.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

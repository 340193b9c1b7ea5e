package placement

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/test/harness"
)

// placementEnv is a consumer's control plane with a scheduler, a local
// node (with an SSD) and the virtual nodes of providers a (region eu)
// and b (region us), each a pretend kubelet with the virtual node's
// labels and taint, as the virtual node controller registers them.
// Provider c has a Peer but no virtual node yet.
type placementEnv struct {
	cp       *harness.ControlPlane
	kube     kubernetes.Interface
	admin    client.Client
	a, b, c  string // the providers' cluster IDs
	agentNS  string
	logs     *logRecorder
	registry *prometheus.Registry
	webhook  *Webhook // the one started last
	port     uint16
	addr     netip.Addr
}

func newPlacementEnv(t *testing.T) *placementEnv {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp1", harness.ControlPlaneOptions{Scheduler: true, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
	offloadtest.MustApplyCRDs(t, cp.Config)
	e := &placementEnv{
		cp: cp, kube: cp.Client, admin: offloadtest.AdminClient(t, cp),
		a: offloadtest.NewConsumer(t), b: offloadtest.NewConsumer(t), c: offloadtest.NewConsumer(t),
		agentNS: "flotilla-system", logs: &logRecorder{t: t}, registry: prometheus.NewRegistry(),
		addr: netip.MustParseAddr("127.0.0.1"), port: freePort(t),
	}
	ctx := t.Context()
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.agentNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for id, labels := range map[string]map[string]string{
		e.a: {"region": "eu"}, e.b: {"region": "us"},
		// A Peer's labels under Kubernetes' prefixes never reach its
		// virtual node.
		e.c: {"region": "ap", "topology.kubernetes.io/zone": "ap-1"},
	} {
		if err := e.admin.Create(ctx, &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: labels}}); err != nil {
			t.Fatal(err)
		}
	}
	cp.StartKubelet("local1", harness.KubeletOptions{Labels: map[string]string{"disk": "ssd"}})
	e.startVirtualNode(t, e.a, "a", "eu")
	e.startVirtualNode(t, e.b, "b", "us")
	return e
}

// startVirtualNode registers the virtual node of provider id.
func (e *placementEnv) startVirtualNode(t *testing.T, id, name, region string) {
	t.Helper()
	e.cp.StartKubelet(offload.VirtualNodeName(id), harness.KubeletOptions{
		Labels: map[string]string{offload.LabelVirtualNode: "true", offload.LabelClusterID: id, offload.LabelClusterName: name, "region": region},
		Taints: []corev1.Taint{{Key: offload.TaintVirtualNode, Value: "true", Effect: corev1.TaintEffectNoExecute}},
	})
}

// freePort is a loopback port nothing listened on a moment ago.
func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// logRecorder keeps the webhook's log lines, for what it was asked, and
// passes them to the test's log.
type logRecorder struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.lines = append(r.lines, strings.TrimSpace(string(p)))
	r.mu.Unlock()
	r.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (r *logRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines)
}

// admissions are the logged admissions of pods in namespace ns, by name.
func (r *logRecorder) admissions(ns string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		if strings.Contains(l, `msg="placement admission"`) && strings.Contains(l, " namespace="+ns+" ") {
			_, rest, _ := strings.Cut(l, " name=")
			name, _, _ := strings.Cut(rest, " ")
			out = append(out, name)
		}
	}
	return out
}

// start runs a placement webhook with the lifetimes of tweak until the
// returned stop is called (or the test ends).
func (e *placementEnv) start(t *testing.T, tweak func(*WebhookConfig)) (stop func()) {
	t.Helper()
	// The harness's API servers present a client certificate to
	// webhooks, signed by the cluster's client CA, as an operator
	// configures it: the webhook requires it, as the agent runs it by
	// default.
	cfg := WebhookConfig{
		Config: e.cp.Config, Address: e.addr, Port: e.port, AgentNamespace: e.agentNS,
		ClientNames: DefaultClientNames,
		Shared:      offloadtest.StartSharedCache(t, e.cp.Config, nil),
		Logger:      slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:     e.registry,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	w, err := NewWebhook(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.webhook = w
	run := offloadtest.RunUntilCleanup(t, "placement.Webhook.Run", w.Run)
	// Stopped, its metric goes: a webhook started again registers it.
	var once sync.Once
	stop = func() {
		once.Do(func() {
			run()
			e.registry.Unregister(w.requests)
			e.registry.Unregister(w.limited)
			e.registry.Unregister(w.certs)
		})
	}
	t.Cleanup(stop)
	return stop
}

// offloadNamespace makes namespace ns offloaded with mode to the
// clusters ids, as the mirror.Consumer leaves it: a NamespaceOffload
// whose status lists them, and the namespace labelled (the
// mirror.Consumer's own test shows it labels it).
func (e *placementEnv) offloadNamespace(t *testing.T, ns string, mode v1alpha1.PodOffloading, ids ...string) {
	t.Helper()
	ctx := t.Context()
	if err := e.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{offload.LabelOffloaded: "true"}}}); err != nil {
		t.Fatal(err)
	}
	o := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"}, Spec: v1alpha1.NamespaceOffloadSpec{PodOffloading: mode}}
	if err := e.admin.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	o.Status = v1alpha1.NamespaceOffloadStatus{Phase: v1alpha1.OffloadReady, ObservedGeneration: o.Generation}
	if len(ids) == 0 {
		o.Status.Phase = v1alpha1.OffloadNoClusterSelected
	}
	names := map[string]string{e.a: "a", e.b: "b", e.c: "c"}
	for _, id := range ids {
		o.Status.Clusters = append(o.Status.Clusters, v1alpha1.ClusterOffload{ClusterID: id, ClusterName: names[id]})
	}
	if err := e.admin.Status().Update(ctx, o); err != nil {
		t.Fatal(err)
	}
}

func webPod(name string, changes ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "example.invalid/web"}}},
	}
	for _, c := range changes {
		c(p)
	}
	return p
}

func (e *placementEnv) create(t *testing.T, ns string, pod *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	return e.kube.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{})
}

func (e *placementEnv) mustCreate(t *testing.T, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	p, err := e.create(t, ns, pod)
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, pod.Name, err)
	}
	return p
}

// waitActive waits until the API server sends the pods of namespace ns
// to the webhook: a dry run of a pod there comes back with our
// toleration. Before, a pod would be admitted unplaced.
func (e *placementEnv) waitActive(t *testing.T, ns string) {
	t.Helper()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	eventually.Within(t, 60*time.Second, "the API server calls the placement webhook", func() error {
		p, err := e.kube.CoreV1().Pods(ns).Create(t.Context(), webPod("probe"), dry)
		if err != nil {
			return err
		}
		if !slices.Contains(p.Spec.Tolerations, virtualNodeToleration) {
			return fmt.Errorf("dry-run pod admitted without placement: tolerations %v", p.Spec.Tolerations)
		}
		return nil
	})
}

// waitBound waits until pod ns/name is bound to a node and returns it.
func (e *placementEnv) waitBound(t *testing.T, ns, name string) string {
	t.Helper()
	var node string
	eventually.Within(t, 60*time.Second, "pod "+ns+"/"+name+" scheduled", func() error {
		p, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if node = p.Spec.NodeName; node == "" {
			return fmt.Errorf("not bound; conditions %v", p.Status.Conditions)
		}
		return nil
	})
	return node
}

func (e *placementEnv) requests(t *testing.T, result string) float64 {
	t.Helper()
	mfs, err := e.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flotilla_webhook_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestPlacementWebhook runs the webhook in the test process and lets a
// real kube-apiserver call it (at 127.0.0.1: the API server runs in the
// host's network namespace, as the test does), with a real scheduler
// placing the pods it admitted. The subtests run in order.
func TestPlacementWebhook(t *testing.T) {
	e := newPlacementEnv(t)
	e.offloadNamespace(t, "remote", v1alpha1.PodsRemote, e.a)
	// A selector picked b only.
	e.offloadNamespace(t, "both", v1alpha1.PodsLocalAndRemote, e.b)
	e.offloadNamespace(t, "local", v1alpha1.PodsLocal, e.a)
	e.offloadNamespace(t, "waiting", v1alpha1.PodsRemote, e.c)
	e.offloadNamespace(t, "none", v1alpha1.PodsRemote)
	if err := e.admin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}); err != nil {
		t.Fatal(err)
	}
	top := t // the webhook outlives each subtest
	stop := e.start(top, nil)
	e.waitActive(t, "remote")

	t.Run("RemotePodsRunOnTheSelectedVirtualNode", func(t *testing.T) {
		seconds := int64(300)
		for i := range 3 {
			name := fmt.Sprintf("web-%d", i)
			p := e.mustCreate(t, "remote", webPod(name))
			want := []corev1.NodeSelectorTerm{term(in(offload.LabelClusterID, e.a))}
			if got := requiredTerms(p); !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("pod %s: required terms %+v, want %+v", name, got, want)
			}
			for _, tol := range []corev1.Toleration{virtualNodeToleration, foreverTolerations[0], foreverTolerations[1]} {
				if !slices.Contains(p.Spec.Tolerations, tol) {
					t.Errorf("pod %s lacks toleration %+v: %+v", name, tol, p.Spec.Tolerations)
				}
			}
			// DefaultTolerationSeconds did not add its own after ours.
			for _, tol := range p.Spec.Tolerations {
				if tol.TolerationSeconds != nil && *tol.TolerationSeconds == seconds {
					t.Errorf("pod %s keeps a toleration of 300 s: %+v", name, tol)
				}
			}
			if node := e.waitBound(t, "remote", name); node != offload.VirtualNodeName(e.a) {
				t.Errorf("pod %s scheduled onto %s, want %s (a); b's virtual node and local1 are not for it", name, node, offload.VirtualNodeName(e.a))
			}
		}
	})

	t.Run("LocalAndRemoteOnlyOnSelectedVirtualNodesAndLocalNodes", func(t *testing.T) {
		if node := e.waitBound(t, "both", e.mustCreate(t, "both", webPod("us", nodeSelector("region", "us"))).Name); node != offload.VirtualNodeName(e.b) {
			t.Errorf("pod selecting region us on %s, want b's virtual node", node)
		}
		if node := e.waitBound(t, "both", e.mustCreate(t, "both", webPod("ssd", nodeSelector("disk", "ssd"))).Name); node != "local1" {
			t.Errorf("pod selecting disk ssd on %s, want local1", node)
		}
		for i := range 4 {
			p := e.mustCreate(t, "both", webPod(fmt.Sprintf("any-%d", i)))
			// It keeps DefaultTolerationSeconds' tolerations: it may run
			// here again.
			if !slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool {
				return tol.Key == corev1.TaintNodeNotReady && tol.TolerationSeconds != nil
			}) {
				t.Errorf("pod %s lost the default not-ready toleration: %+v", p.Name, p.Spec.Tolerations)
			}
			if node := e.waitBound(t, "both", p.Name); node != "local1" && node != offload.VirtualNodeName(e.b) {
				t.Errorf("pod %s on %s: only local1 and b's virtual node are allowed", p.Name, node)
			}
		}
		_, err := e.create(t, "both", webPod("eu", nodeSelector("region", "eu")))
		wantRefusal(t, err, "nodeSelector region=eu", "match node "+offload.VirtualNodeName(e.a), "podOffloading LocalAndRemote", "b ("+e.b+")")
	})

	t.Run("LocalPodsUntouched", func(t *testing.T) {
		before := e.requests(t, resultAdmitted)
		p := e.mustCreate(t, "local", webPod("here"))
		if p.Spec.Affinity != nil || slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.Key == offload.TaintVirtualNode }) {
			t.Errorf("a Local pod was changed: affinity %+v, tolerations %+v", p.Spec.Affinity, p.Spec.Tolerations)
		}
		if got := e.requests(t, resultAdmitted); got != before+1 {
			t.Errorf("admitted %v, was %v: the webhook was not asked", got, before)
		}
		if node := e.waitBound(t, "local", "here"); node != "local1" {
			t.Errorf("Local pod on %s", node)
		}
		_, err := e.create(t, "local", webPod("astray", nodeSelector(offload.LabelVirtualNode, "true")))
		wantRefusal(t, err, "podOffloading Local: only on this cluster's own nodes")
	})

	t.Run("ContradictingPodsRefused", func(t *testing.T) {
		before := e.requests(t, resultRefused)
		_, err := e.create(t, "remote", webPod("ssd", nodeSelector("disk", "ssd")))
		wantRefusal(t, err, `admission webhook "placement.flotilla.io" denied the request`,
			"pod remote/ssd can run nowhere", "nodeSelector disk=ssd", "match node local1", "podOffloading Remote", "a ("+e.a+")")
		_, err = e.create(t, "remote", webPod("pinned", nodeName("local1")))
		wantRefusal(t, err, "nodeName local1")
		_, err = e.create(t, "none", webPod("early"))
		wantRefusal(t, err, "namespace none is offloaded with podOffloading Remote", "no provider yet")
		if got := e.requests(t, resultRefused); got != before+3 {
			t.Errorf("refused %v, was %v", got, before)
		}
		for _, p := range []string{"remote/ssd", "remote/pinned", "none/early"} {
			ns, name, _ := strings.Cut(p, "/")
			if _, err := e.kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("refused pod %s: %v, want NotFound", p, err)
			}
		}
	})

	t.Run("WaitsForAVirtualNodeStillToCome", func(t *testing.T) {
		e.mustCreate(t, "waiting", webPod("early", nodeSelector("region", "ap")))
		// The scheduler tried, and found no node: c's is not there yet.
		eventually.Within(t, 60*time.Second, "pod unschedulable", func() error {
			p, err := e.kube.CoreV1().Pods("waiting").Get(t.Context(), "early", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					return nil
				}
			}
			return fmt.Errorf("node %q, conditions %v", p.Spec.NodeName, p.Status.Conditions)
		})
		e.startVirtualNode(t, e.c, "c", "ap")
		if node := e.waitBound(t, "waiting", "early"); node != offload.VirtualNodeName(e.c) {
			t.Errorf("pod on %s, want c's virtual node", node)
		}
	})

	t.Run("NotOffloadedNamespacesNeverReachTheWebhook", func(t *testing.T) {
		lonely := e.mustCreate(t, "plain", webPod("lonely"))
		// Created after it: once its admission is logged, the one in
		// plain would have been too.
		e.mustCreate(t, "remote", webPod("after"))
		eventually.Within(t, 10*time.Second, "admission of remote/after logged", func() error {
			if !slices.Contains(e.logs.admissions("remote"), "after") {
				return fmt.Errorf("admissions in remote: %v", e.logs.admissions("remote"))
			}
			return nil
		})
		if got := e.logs.admissions("plain"); len(got) > 0 {
			t.Errorf("pods of namespace plain, not offloaded, were sent to the webhook: %v", got)
		}
		if lonely.Spec.Affinity != nil || slices.ContainsFunc(lonely.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.Key == offload.TaintVirtualNode }) {
			t.Errorf("a pod of a namespace not offloaded was changed: %+v", lonely.Spec)
		}
		if node := e.waitBound(t, "plain", "lonely"); node != "local1" {
			t.Errorf("pod of a namespace not offloaded on %s", node)
		}
	})

	// Every admission above came from the API server with its client
	// certificate (the positive witness), checked by default against
	// the cluster's client CA; a stranger without one, a stranger with
	// one of its own CA named as the API server's, and the cluster's
	// admin with its own (signed by the cluster's client CA) are refused
	// before the webhook reads their review.
	t.Run("OnlyTheAPIServerIsAnswered", func(t *testing.T) {
		admin, err := tls.X509KeyPair(e.cp.Config.CertData, e.cp.Config.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		forged := selfSignedClient(t, harness.WebhookClientName)
		for _, tc := range []struct {
			who    string
			certs  []tls.Certificate
			code   int
			reason string
		}{
			{"a stranger without a certificate", nil, http.StatusUnauthorized, limitNoClientCert},
			{"a stranger's certificate named as the API server's", []tls.Certificate{forged}, http.StatusUnauthorized, limitClientNotAllowed},
			{"the admin's certificate", []tls.Certificate{admin}, http.StatusForbidden, limitClientNotAllowed},
		} {
			before := e.limited(t, tc.reason)
			code, _ := e.post(t, tc.certs, bytes.NewReader([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`)), -1)
			t.Logf("%s: %d", tc.who, code)
			if code != tc.code {
				t.Errorf("%s: %d, want %d", tc.who, code, tc.code)
			}
			if got := e.limited(t, tc.reason) - before; got != 1 {
				t.Errorf("%s: %v refusals counted for %s, want 1", tc.who, got, tc.reason)
			}
		}
	})

	// A thousand reviews of 8 MiB each from a stranger: each refused
	// without its body being read, the heap grows by less than
	// floodHeapLimit, and the API server's admissions still place pods.
	t.Run("AFloodOfLargeReviewsIsRefused", func(t *testing.T) {
		const (
			requests, size, workers = 1000, 8 << 20, 8
			// floodHeapLimit is half the agent's memory limit (128 MiB
			// in deploy/deployment.yaml).
			floodHeapLimit = 64 << 20
		)
		before := e.limited(t, limitNoClientCert)
		runtime.GC()
		base := heapBytes()
		peak := harness.SamplePeak(5*time.Millisecond, func() (uint64, error) { return heapBytes(), nil })
		var wrong, whole atomic.Int64
		harness.Flood(requests, workers, func() {
			body := &countingReader{left: size}
			code, err := e.post(t, nil, body, size)
			if err != nil || code != http.StatusUnauthorized {
				wrong.Add(1)
			}
			if body.read.Load() == size {
				whole.Add(1)
			}
		})
		peakHeap := peak.Stop()
		if n := wrong.Load(); n != 0 {
			t.Errorf("%d of %d requests not refused with 401", n, requests)
		}
		if n := whole.Load(); n != 0 {
			t.Errorf("%d of %d requests had their whole 8 MiB read", n, requests)
		}
		if got := e.limited(t, limitNoClientCert) - before; got != requests {
			t.Errorf("%v refusals counted, want %d", got, requests)
		}
		grew := int64(peakHeap) - int64(base)
		t.Logf("heap in use grew by at most %.1f MiB during the flood", float64(grew)/(1<<20))
		if grew > floodHeapLimit {
			t.Errorf("heap in use grew by %d MiB during the flood, limit %d MiB", grew>>20, floodHeapLimit>>20)
		}
		e.waitActive(t, "remote")
	})

	t.Run("ReadyWithItsCertificates", func(t *testing.T) {
		if err := e.webhook.Ready(); err != nil {
			t.Errorf("Ready while it admits pods: %v", err)
		}
		serving := offloadtest.ExpiryGauge(t, e.registry, "placement_webhook", "serving")
		ca := offloadtest.ExpiryGauge(t, e.registry, "placement_webhook", "ca")
		if serving <= 0 || serving > certs.DefaultWebhookServingLifetime.Seconds() || ca < serving || ca > certs.DefaultWebhookCALifetime.Seconds() {
			t.Errorf("flotilla_certificate_expiry_seconds: serving %v, ca %v; want within their lifetimes, the CA outliving the serving certificate", serving, ca)
		}
	})

	t.Run("RestartKeepsTheCA", func(t *testing.T) {
		before := e.bundle(t)
		stopped := e.webhook
		stop()
		if err := stopped.Ready(); err == nil || !strings.Contains(err.Error(), "not serving") {
			t.Errorf("Ready of a stopped webhook: %v, want not serving", err)
		}
		stop = e.start(top, nil)
		e.waitActive(t, "remote")
		if after := e.bundle(t); !bytes.Equal(before, after) {
			t.Errorf("the caBundle changed across a restart:\n%s\nthen\n%s", before, after)
		}
	})

	t.Run("AnUnusableCASecretIsReplaced", func(t *testing.T) {
		before := e.bundle(t)
		stop()
		patch := fmt.Appendf(nil, `{"data":{%q:%q}}`, certs.CAKeyKey, "bm90IGEga2V5")
		if _, err := e.kube.CoreV1().Secrets(e.agentNS).Patch(t.Context(), CASecret, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		stop = e.start(top, nil)
		e.waitActive(t, "remote")
		if after := e.bundle(t); bytes.Equal(before, after) {
			t.Errorf("the caBundle is the same after the CA Secret became unusable")
		}
		if ids := e.secretCAs(t); len(ids) != 1 {
			t.Errorf("the CA Secret holds %d CAs, want the new one", len(ids))
		}
		if !slices.ContainsFunc(e.logs.all(), func(l string) bool {
			return strings.Contains(l, "CA Secret is unusable") && strings.Contains(l, "not PEM")
		}) {
			t.Errorf("no log line says why the CA was replaced")
		}
	})

	t.Run("EditsArePutBack", func(t *testing.T) {
		patch := []byte(`{"webhooks":[{"name":"` + WebhookName + `","failurePolicy":"Ignore"}]}`)
		if _, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(t.Context(), ConfigurationName,
			"application/strategic-merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 30*time.Second, "failurePolicy Fail again", func() error {
			c, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), ConfigurationName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p := c.Webhooks[0].FailurePolicy; p == nil || *p != "Fail" {
				return fmt.Errorf("failurePolicy %v", *p)
			}
			return nil
		})
	})

	t.Run("UninstallRemovesTheConfiguration", func(t *testing.T) {
		stop()
		// The agent's cleanup path...
		if err := DeleteConfiguration(t.Context(), e.kube); err != nil {
			t.Fatal(err)
		}
		if err := DeleteConfiguration(t.Context(), e.kube); err != nil {
			t.Errorf("deleting it again: %v", err)
		}
		e.waitAdmittedUnplaced(t, "remote")
		// ...or `kubectl delete -k deploy/`, which deletes the CRD that
		// owns the configuration.
		stop = e.start(top, nil)
		e.waitActive(t, "remote")
		c, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), ConfigurationName, metav1.GetOptions{})
		if err != nil || len(c.OwnerReferences) != 1 || c.OwnerReferences[0].Name != offloadCRD {
			t.Fatalf("configuration %v owned by %+v, want the CRD %s", err, c.OwnerReferences, offloadCRD)
		}
		stop()
		crds := apiextensionsclient.NewForConfigOrDie(e.cp.Config).ApiextensionsV1().CustomResourceDefinitions()
		if err := crds.Delete(t.Context(), offloadCRD, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 60*time.Second, "configuration collected with the CRD", func() error {
			_, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), ConfigurationName, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
		e.waitAdmittedUnplaced(t, "remote")
	})
}

// waitAdmittedUnplaced waits until a pod of ns is admitted without the
// webhook (its configuration is gone, and the API server knows).
func (e *placementEnv) waitAdmittedUnplaced(t *testing.T, ns string) {
	t.Helper()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	eventually.Within(t, 60*time.Second, "pods admitted without the webhook", func() error {
		p, err := e.kube.CoreV1().Pods(ns).Create(t.Context(), webPod("probe"), dry)
		if err != nil {
			return err
		}
		if slices.Contains(p.Spec.Tolerations, virtualNodeToleration) {
			return fmt.Errorf("still placed")
		}
		return nil
	})
}

// post sends body (of length size, -1 for unknown) to the webhook as a
// client holding certs, trusting the webhook's CA; it returns the status
// code.
func (e *placementEnv) post(t *testing.T, certs []tls.Certificate, body io.Reader, size int64) (int, error) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.bundle(t))
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}, ForceAttemptHTTP2: true,
	}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.webhook.url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, nil
}

func (e *placementEnv) limited(t *testing.T, reason string) float64 {
	t.Helper()
	return testutil.ToFloat64(e.webhook.limited.WithLabelValues(reason))
}

// countingReader is a body of left bytes that counts what was read.
type countingReader struct {
	left int64
	read atomic.Int64
}

func (r *countingReader) Read(b []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(b)), r.left)
	clear(b[:n])
	r.left -= n
	r.read.Add(n)
	return int(n), nil
}

// heapBytes is the memory the heap's objects occupy, live or not yet
// collected.
func heapBytes() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

func (e *placementEnv) bundle(t *testing.T) []byte {
	t.Helper()
	c, err := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), ConfigurationName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Webhooks[0].ClientConfig.CABundle
}

func wantRefusal(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("created; want a refusal saying %q", parts)
		return
	}
	if !apierrors.IsForbidden(err) {
		t.Errorf("refusal %v is not Forbidden", err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("refusal %q\nlacks %q", err, p)
		}
	}
}

// A CA lifetime of 30 s makes the webhook rotate its CA while pods are
// being admitted: the caBundle carries the old and the new CA, the
// serving certificate moves to the new one, the old one goes when it
// expires, and no admission fails meanwhile.
func TestPlacementWebhookRotatesItsCA(t *testing.T) {
	e := newPlacementEnv(t)
	e.offloadNamespace(t, "remote", v1alpha1.PodsRemote, e.a)
	e.start(t, func(c *WebhookConfig) {
		c.CALifetime, c.ServingLifetime, c.CAPublishDelay = 30*time.Second, 9*time.Second, 3*time.Second
	})
	e.waitActive(t, "remote")
	seen := offloadtest.NewRotationSeen(t, offloadtest.BundleIDs(t, e.bundle(t)))

	// Admit pods (dry runs: no objects left) until the first CA is gone
	// from the bundle, having seen both CAs in it and the serving
	// certificate signed by each.
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	secretBoth := false
	for admitted := 1; ; admitted++ {
		p, err := e.kube.CoreV1().Pods("remote").Create(t.Context(), webPod("probe"), dry)
		if err != nil {
			t.Fatalf("admission %d failed during the rotation: %v", admitted, err)
		}
		if !slices.Contains(p.Spec.Tolerations, virtualNodeToleration) {
			t.Fatalf("admission %d was not placed", admitted)
		}
		if len(e.secretCAs(t)) == 2 {
			secretBoth = true
		}
		if seen.Observe(t, offloadtest.BundleIDs(t, e.bundle(t)), e.servedIssuer(t)) {
			t.Logf("%d admissions across the rotation; %v", admitted, seen)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !secretBoth {
		t.Errorf("the CA Secret never held both CAs")
	}
}

func (e *placementEnv) secretCAs(t *testing.T) []string {
	t.Helper()
	s, err := e.kube.CoreV1().Secrets(e.agentNS).Get(t.Context(), CASecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return offloadtest.BundleIDs(t, s.Data[certs.CACertKey])
}

// servedIssuer is the authority key ID of the certificate the webhook
// serves now.
func (e *placementEnv) servedIssuer(t *testing.T) string {
	t.Helper()
	c, err := tls.Dial("tcp", netip.AddrPortFrom(e.addr, e.port).String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return hex.EncodeToString(c.ConnectionState().PeerCertificates[0].AuthorityKeyId)
}

// selfSignedClient is a client certificate named cn that no cluster's CA
// signed.
func selfSignedClient(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

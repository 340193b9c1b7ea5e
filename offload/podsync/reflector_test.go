package podsync

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/mirror"
	"github.com/flotilla-io/flotilla/test/harness"
)

// podsEnv is an offloadenv.PodEnv and the Reflectors a test runs in it.
type podsEnv struct {
	*offloadenv.PodEnv
	reflectors []*Reflector // every one started, the running one last
	registry   *prometheus.Registry
	stop       func() // stops the running Reflector
	// peers is the cache of Peers the reflectors share, as in the agent
	// (a SharedCache, which their NamespaceOffloads come from too): it
	// outlives each of them.
	peers offload.PeerCache
}

func newPodsEnv(tb testing.TB, o offloadenv.PodEnvOptions) *podsEnv {
	return &podsEnv{PodEnv: offloadenv.NewPodEnv(tb, o)}
}

// startReflector runs a new Reflector until stopReflector or the
// test's end.
func (e *podsEnv) startReflector(tb testing.TB, workers int, logs bool) {
	tb.Helper()
	handler := slog.Handler(slog.DiscardHandler)
	if logs {
		handler = slog.NewTextHandler(offloadtest.LogWriter{T: tb}, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	e.registry = prometheus.NewRegistry()
	// As the agent's (agent.KubeConfig): no client-side rate limit.
	local := rest.CopyConfig(e.Local.Config)
	local.QPS, local.Burst = -1, -1
	if e.peers == nil {
		peers, err := cache.New(local, cache.Options{Scheme: offload.MirrorScheme(), Mapper: offload.MirrorMapper()})
		if err != nil {
			tb.Fatal(err)
		}
		offloadtest.RunUntilCleanup(tb, "the cache of Peers", peers.Start)
		e.peers = offloadtest.StartSharedCache(tb, local, peers)
	}
	r, err := NewReflector(Config{
		Config: local, Self: e.Self, Credentials: e.Creds, Views: e.Views, Address: offloadtest.VirtualNodeAddress,
		Logger: slog.New(handler), Metrics: e.registry, Workers: workers, Peers: e.peers,
	})
	if err != nil {
		tb.Fatal(err)
	}
	e.reflectors = append(e.reflectors, r)
	e.stop = offloadtest.RunUntilCleanup(tb, "podsync.Reflector", r.Run)
}

func (e *podsEnv) stopReflector() { e.stop() }

// reflector is the running Reflector (or the last one).
func (e *podsEnv) reflector() *Reflector { return e.reflectors[len(e.reflectors)-1] }

// podOnVirtualNode is a pod bound to the virtual node with what the
// placement webhook adds (the toleration), as the scheduler binds it.
func (e *podsEnv) podOnVirtualNode(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: *harness.Restricted(&corev1.PodSpec{
			NodeName:    e.Node,
			Tolerations: []corev1.Toleration{{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			Containers:  []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
		}),
	}
}

// createPods creates pods on the consumer; a namespace just made may not
// have its default account yet, which admission waits for.
func (e *podsEnv) createPods(tb testing.TB, pods ...*corev1.Pod) []*corev1.Pod {
	tb.Helper()
	var out []*corev1.Pod
	for _, p := range pods {
		eventually.Within(tb, 30*time.Second, "create pod "+p.Namespace+"/"+p.Name, func() error {
			made, err := e.Local.Client.CoreV1().Pods(p.Namespace).Create(tb.Context(), p, metav1.CreateOptions{})
			if err != nil {
				if strings.Contains(err.Error(), "serviceaccount") {
					return err
				}
				tb.Fatalf("create pod %s/%s: %v", p.Namespace, p.Name, err)
			}
			out = append(out, made)
			return nil
		})
	}
	return out
}

func (e *podsEnv) localPod(tb testing.TB, ns, name string) (*corev1.Pod, bool) {
	tb.Helper()
	p, err := e.Local.Client.CoreV1().Pods(ns).Get(tb.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		tb.Fatal(err)
	}
	return p, true
}

// remotePods are the pods in namespace ns on the provider, by name, as
// its admin sees them (not through the link).
func (e *podsEnv) remotePods(tb testing.TB, ns string) map[string]*corev1.Pod {
	tb.Helper()
	list, err := e.Provider.CP.Client.CoreV1().Pods(ns).List(tb.Context(), metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// waitReflected waits until local pod ns/name runs on the provider and
// shows it: Running, with the provider pod's IP in this cluster's view
// and the virtual node's address as host IP. It returns both pods.
func (e *podsEnv) waitReflected(tb testing.TB, ns, remoteNS, name string) (local, remote *corev1.Pod) {
	tb.Helper()
	eventually.Within(tb, 90*time.Second, "pod "+ns+"/"+name+" reflected", func() error {
		var ok bool
		if local, ok = e.localPod(tb, ns, name); !ok {
			return errors.New("no local pod")
		}
		if remote = e.remotePods(tb, remoteNS)[name]; remote == nil {
			return fmt.Errorf("no pod on the provider; local status %s", describePod(local))
		}
		if remote.Status.Phase != corev1.PodRunning || remote.Status.PodIP == "" || remote.Annotations[offload.AnnotationOrigin] != originOf(local) {
			return fmt.Errorf("the provider's pod: %s, origin %q", describePod(remote), remote.Annotations[offload.AnnotationOrigin])
		}
		want := e.Views.TranslateIP(tb, remote.Status.PodIP)
		s := local.Status
		if s.Phase != corev1.PodRunning || s.PodIP != want || len(s.PodIPs) != 1 || s.PodIPs[0].IP != want ||
			s.HostIP != offloadtest.VirtualNodeAddress.String() || len(s.HostIPs) != 1 || s.HostIPs[0].IP != s.HostIP {
			return fmt.Errorf("local status %s, want Running with IP %s (the provider's %s) on host %s", describePod(local), want, remote.Status.PodIP, offloadtest.VirtualNodeAddress)
		}
		return nil
	})
	return local, remote
}

func describePod(p *corev1.Pod) string {
	s := fmt.Sprintf("phase %q reason %q ip %q host %q", p.Status.Phase, p.Status.Reason, p.Status.PodIP, p.Status.HostIP)
	if p.DeletionTimestamp != nil {
		s += " deleting"
	}
	return s
}

// waitGonePod waits until ns/name is gone from the consumer or, with
// remoteNS set, from the provider.
func (e *podsEnv) waitGonePod(tb testing.TB, ns, name, where string) {
	tb.Helper()
	eventually.Within(tb, 90*time.Second, "pod "+ns+"/"+name+" gone "+where, func() error {
		var p *corev1.Pod
		if where == "here" {
			p, _ = e.localPod(tb, ns, name)
		} else {
			p = e.remotePods(tb, ns)[name]
		}
		if p != nil {
			return fmt.Errorf("still there: %s", describePod(p))
		}
		return nil
	})
}

// waitEvent waits for an event on the local pod with reason and a message
// containing text, and returns its message.
func (e *podsEnv) waitEvent(tb testing.TB, pod *corev1.Pod, reason, text string) string {
	tb.Helper()
	var msg string
	eventually.Within(tb, 90*time.Second, "event "+reason+" on "+pod.Name, func() error {
		sel := fields.Set{"involvedObject.uid": string(pod.UID), "reason": reason}.String()
		list, err := e.Local.Client.CoreV1().Events(pod.Namespace).List(tb.Context(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return err
		}
		var seen []string
		for _, ev := range list.Items {
			if strings.Contains(ev.Message, text) {
				msg = ev.Message
				return nil
			}
			seen = append(seen, ev.Message)
		}
		return fmt.Errorf("events %q", seen)
	})
	return msg
}

// deleteRemote deletes the provider's pod p out of band, as its admin
// would: gracefully, the provider's kubelet confirming, and p itself (its
// UID the precondition), so that a pod replaced since it was read fails
// here instead of going. Grace period 0 would not do: the API server then
// marks the pod and, in a second write, deletes whatever holds its name
// by then; the kubelet's confirmation and a reflector's new pod can come
// in between, and the new pod would go too.
func (e *podsEnv) deleteRemote(tb testing.TB, p *corev1.Pod) {
	tb.Helper()
	uid := p.UID
	err := e.Provider.CP.Client.CoreV1().Pods(p.Namespace).Delete(tb.Context(), p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil {
		tb.Fatalf("delete pod %s/%s (uid %s) on the provider: %v", p.Namespace, p.Name, p.UID, err)
	}
}

func uidsOf(pods map[string]*corev1.Pod) map[string]types.UID {
	out := map[string]types.UID{}
	for name, p := range pods {
		out[name] = p.UID
	}
	return out
}

// TestPodReflector runs the pod reflection between a real consumer and a
// real provider; the subtests run in order, each in namespaces of its
// own, against one Reflector (restarted where a subtest says so).
func TestPodReflector(t *testing.T) {
	e := newPodsEnv(t, offloadenv.PodEnvOptions{Kubelets: 2})
	top := t // the reflector outlives each subtest
	e.startReflector(top, 0, true)
	web := e.OffloadReady(t, "web")

	t.Run("RunningWithTranslatedIP", func(t *testing.T) {
		annotated := e.podOnVirtualNode("web", "a")
		annotated.Annotations = map[string]string{"example.com/note": "kept"}
		made := e.createPods(t, annotated, e.podOnVirtualNode("web", "b"), e.podOnVirtualNode("web", "c"))
		for _, p := range made {
			local, remote := e.waitReflected(t, "web", web, p.Name)
			// The reflector caches pods without their spec and writes
			// their status from that: the pod here keeps all it had.
			if !apiequality.Semantic.DeepEqual(local.Spec, p.Spec) || !maps.Equal(local.Labels, p.Labels) || !maps.Equal(local.Annotations, p.Annotations) {
				t.Errorf("the local pod changed with its status written:\nspec %+v\nwas  %+v\nlabels %v, annotations %v; were %v, %v",
					local.Spec, p.Spec, local.Labels, local.Annotations, p.Labels, p.Annotations)
			}
			if v, ok := p.Annotations["example.com/note"]; ok && remote.Annotations["example.com/note"] != v {
				t.Errorf("the provider's pod annotations %v, want the local ones", remote.Annotations)
			}
			if remote.Spec.NodeName == "" || remote.Spec.NodeName == e.Node {
				t.Errorf("the provider's pod runs on node %q, want one of the provider's", remote.Spec.NodeName)
			}
			if remote.Labels["app"] != p.Name {
				t.Errorf("the provider's pod labels %v, want the local ones", remote.Labels)
			}
			// The consumer's admission gave the local pod its token
			// volume; the provider's pod has none of it, nor the
			// virtual node's toleration.
			if !slices.ContainsFunc(local.Spec.Volumes, offload.IsServiceAccountTokenVolume) {
				t.Errorf("the local pod has no token volume to clean: %v", local.Spec.Volumes)
			}
			if slices.ContainsFunc(remote.Spec.Volumes, offload.IsServiceAccountTokenVolume) || len(remote.Spec.Containers[0].VolumeMounts) != 0 {
				t.Errorf("the provider's pod kept the consumer's token: volumes %v, mounts %v", remote.Spec.Volumes, remote.Spec.Containers[0].VolumeMounts)
			}
			if slices.ContainsFunc(remote.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.Key == offload.TaintVirtualNode }) {
				t.Errorf("the provider's pod tolerates the virtual node: %v", remote.Spec.Tolerations)
			}
			if remote.Spec.ServiceAccountName != "default" || remote.Spec.AutomountServiceAccountToken == nil || *remote.Spec.AutomountServiceAccountToken {
				t.Errorf("the provider's pod runs as %q, automount %v", remote.Spec.ServiceAccountName, remote.Spec.AutomountServiceAccountToken)
			}
		}
	})

	t.Run("DeletionRemovesTheRemotePodFirst", func(t *testing.T) {
		// A finalizer holds the provider's pod while deleted: the local
		// pod must wait for it.
		remote := e.remotePods(t, web)["a"]
		patch := []byte(`{"metadata":{"finalizers":["test.flotilla.io/hold"]}}`)
		if _, err := e.Provider.CP.Client.CoreV1().Pods(web).Patch(t.Context(), "a", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := e.Local.Client.CoreV1().Pods("web").Delete(t.Context(), "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 60*time.Second, "the provider's pod deleted", func() error {
			if p := e.remotePods(t, web)["a"]; p == nil || p.UID != remote.UID || p.DeletionTimestamp == nil {
				return errors.New("not being deleted")
			}
			return nil
		})
		if p, ok := e.localPod(t, "web", "a"); !ok || p.DeletionTimestamp == nil {
			t.Fatalf("the local pod went before the provider's: %v", ok)
		}
		patch = []byte(`{"metadata":{"finalizers":null}}`)
		if _, err := e.Provider.CP.Client.CoreV1().Pods(web).Patch(t.Context(), "a", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitGonePod(t, web, "a", "there")
		e.waitGonePod(t, "web", "a", "here")
	})

	t.Run("RemoteDeletedOutOfBandIsRecreated", func(t *testing.T) {
		local, before := e.waitReflected(t, "web", web, "b")
		e.deleteRemote(t, before)
		eventually.Within(t, 60*time.Second, "the provider's pod made again", func() error {
			if p := e.remotePods(t, web)["b"]; p == nil || p.UID == before.UID {
				return errors.New("not yet")
			}
			return nil
		})
		after, remote := e.waitReflected(t, "web", web, "b")
		if after.UID != local.UID {
			t.Errorf("the local pod was replaced (uid %s, was %s)", after.UID, local.UID)
		}
		if remote.Status.PodIP == before.Status.PodIP {
			t.Logf("the new pod got the old one's address %s", remote.Status.PodIP)
		}
	})

	t.Run("NotOffloadedNamespaceFails", func(t *testing.T) {
		if err := e.LocalAdmin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}); err != nil {
			t.Fatal(err)
		}
		p := e.createPods(t, e.podOnVirtualNode("plain", "stray"))[0]
		eventually.Within(t, 60*time.Second, "refused", func() error {
			got, _ := e.localPod(t, "plain", "stray")
			if got == nil || got.Status.Phase != corev1.PodFailed || got.Status.Reason != ReasonNotOffloaded {
				return fmt.Errorf("status %v", got)
			}
			if !strings.Contains(got.Status.Message, "not offloaded") {
				return fmt.Errorf("message %q", got.Status.Message)
			}
			return nil
		})
		e.waitEvent(t, p, ReasonNotOffloaded, "plain")
		if n := testutil.ToFloat64(e.reflector().m.errors.WithLabelValues(e.Provider.ID, offload.ErrNotOffloaded)); n == 0 {
			t.Errorf("flotilla_reflection_errors_total{reason=%q} = 0", offload.ErrNotOffloaded)
		}
	})

	t.Run("LocalPodsStayLocal", func(t *testing.T) {
		local := e.OffloadReady(t, "local")
		e.createPods(t, e.podOnVirtualNode("local", "before"))
		_, running := e.waitReflected(t, "local", local, "before")
		var o v1alpha1.NamespaceOffload
		if err := e.LocalAdmin.Get(t.Context(), client.ObjectKey{Namespace: "local", Name: "offload"}, &o); err != nil {
			t.Fatal(err)
		}
		o.Spec.PodOffloading = v1alpha1.PodsLocal
		if err := e.LocalAdmin.Update(t.Context(), &o); err != nil {
			t.Fatal(err)
		}
		e.WaitStatus(t, "local", "Local observed", func(o *v1alpha1.NamespaceOffload) error {
			if o.Status.ObservedGeneration != o.Generation {
				return errors.New("not yet")
			}
			return nil
		})
		p := e.createPods(t, e.podOnVirtualNode("local", "after"))[0]
		msg := e.waitEvent(t, p, ReasonNotOffloaded, "Local")
		if got, _ := e.localPod(t, "local", "after"); got.Status.Phase != corev1.PodFailed {
			t.Errorf("a new pod in a Local namespace: %s (%s)", describePod(got), msg)
		}
		// The one running there before runs on, also after a restart
		// (which finds it there before deciding).
		if _, again := e.waitReflected(t, "local", local, "before"); again.UID != running.UID {
			t.Errorf("the pod running there was replaced")
		}
		e.stopReflector()
		e.startReflector(top, 0, true)
		eventually.Within(t, 30*time.Second, "the restarted reflector listed the provider", func() error {
			pp := e.reflector().provider(e.Provider.ID)
			if pp == nil || !pp.localSynced.Load() {
				return errors.New("not yet")
			}
			if rn := pp.namespace(local); rn == nil || !rn.synced.Load() || e.reflector().queue.Len() > 0 {
				return errors.New("not yet")
			}
			return nil
		})
		if got, _ := e.localPod(t, "local", "before"); got.Status.Phase != corev1.PodRunning {
			t.Errorf("after a restart, the pod running there shows %s", describePod(got))
		}
	})

	t.Run("NamespaceNotReadyWaits", func(t *testing.T) {
		// kube-system is reserved on every provider: refused, never
		// Ready, so the pod waits and says why.
		e.Offload(t, "held", "offload", v1alpha1.NamespaceOffloadSpec{NamespaceMapping: v1alpha1.MappingSelected, RemoteName: "kube-system"})
		e.WaitStatus(t, "held", "refused", offloadenv.PhaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": mirror.ReasonReserved}))
		p := e.createPods(t, e.podOnVirtualNode("held", "waits"))[0]
		e.waitEvent(t, p, EventWaiting, mirror.ReasonReserved)
		got, _ := e.localPod(t, "held", "waits")
		if got.Status.Phase != corev1.PodPending || got.Status.HostIP != "" {
			t.Errorf("the waiting pod's status: %s", describePod(got))
		}
		if pod := e.remotePods(t, "kube-system")["waits"]; pod != nil {
			t.Errorf("a pod was made in the refused namespace: %s", describePod(pod))
		}
	})

	t.Run("QuotaRefusalShownThenRetried", func(t *testing.T) {
		e.Grants.Set(e.Self, grant.Limits{Pods: 1})
		t.Cleanup(func() { e.Grants.Set(e.Self, grant.Limits{}) })
		quota := e.OffloadReady(t, "quota")
		// Quota admission counts once the quota controller wrote the
		// quota's status.
		eventually.Within(t, 60*time.Second, "quota in force", func() error {
			q, err := e.Provider.CP.Client.CoreV1().ResourceQuotas(quota).Get(t.Context(), offload.GrantSecret, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if n, ok := q.Status.Hard[corev1.ResourcePods]; !ok || n.Value() != 1 {
				return fmt.Errorf("status %v", q.Status.Hard)
			}
			return nil
		})
		e.createPods(t, e.podOnVirtualNode("quota", "q1"))
		e.waitReflected(t, "quota", quota, "q1")
		q2 := e.createPods(t, e.podOnVirtualNode("quota", "q2"))[0]
		msg := e.waitEvent(t, q2, EventProviderRefused, "exceeded quota")
		if !strings.Contains(msg, "pods=1") || !strings.Contains(msg, e.Provider.ID) {
			t.Errorf("event %q does not carry the provider's message or name", msg)
		}
		if n := testutil.ToFloat64(e.reflector().m.errors.WithLabelValues(e.Provider.ID, offload.ErrQuota)); n == 0 {
			t.Errorf("flotilla_reflection_errors_total{reason=%q} = 0", offload.ErrQuota)
		}
		// Once the provider grants more, the retries get it there.
		e.Grants.Set(e.Self, grant.Limits{})
		e.waitReflected(t, "quota", quota, "q2")
	})

	t.Run("RestartDeletesNothing", func(t *testing.T) {
		e.createPods(t, e.podOnVirtualNode("web", "e"))
		e.waitReflected(t, "web", web, "e")
		e.waitReflected(t, "web", web, "c")
		_, oob := e.waitReflected(t, "web", web, "b")
		e.stopReflector()
		before := uidsOf(e.remotePods(t, web))
		// While it is down: a new pod, a deleted one, one deleted out of
		// band.
		e.createPods(t, e.podOnVirtualNode("web", "d"))
		if err := e.Local.Client.CoreV1().Pods("web").Delete(t.Context(), "c", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.deleteRemote(t, oob)
		e.startReflector(top, 0, true)
		e.waitReflected(t, "web", web, "d")
		e.waitGonePod(t, web, "c", "there")
		e.waitGonePod(t, "web", "c", "here")
		_, b := e.waitReflected(t, "web", web, "b")
		if b.UID == oob.UID {
			t.Errorf("the pod deleted out of band is back with its old uid")
		}
		if after := e.remotePods(t, web)["e"]; after == nil || after.UID != before["e"] {
			t.Errorf("the untouched pod e was replaced on the provider")
		}
	})

	t.Run("FiftyPodsCancelledMidway", func(t *testing.T) {
		fifty := e.OffloadReady(t, "fifty")
		e.stopReflector()
		var pods []*corev1.Pod
		for i := range 50 {
			pods = append(pods, e.podOnVirtualNode("fifty", fmt.Sprintf("p%02d", i)))
		}
		made := e.createPods(t, pods...)
		// One worker, stopped once some but not all are made there.
		e.startReflector(top, 1, false)
		eventually.Within(t, 60*time.Second, "some pods made there", func() error {
			if n := len(e.remotePods(t, fifty)); n < 10 {
				return fmt.Errorf("%d", n)
			}
			return nil
		})
		e.stopReflector()
		before := uidsOf(e.remotePods(t, fifty))
		t.Logf("stopped with %d of 50 pods made on the provider", len(before))
		e.startReflector(top, 0, false)
		for _, p := range made {
			e.waitReflected(t, "fifty", fifty, p.Name)
		}
		after := e.remotePods(t, fifty)
		if len(after) != 50 {
			t.Errorf("%d pods on the provider, want 50", len(after))
		}
		for name, uid := range before {
			if after[name] == nil || after[name].UID != uid {
				t.Errorf("pod %s made before the stop was replaced", name)
			}
		}
		for _, p := range made {
			if r := after[p.Name]; r == nil || r.Annotations[offload.AnnotationOrigin] != originOf(p) {
				t.Errorf("pod %s on the provider does not stand for the local one", p.Name)
			}
		}
	})

	t.Run("ProviderUnreachableDeletesNothing", func(t *testing.T) {
		e.stopReflector() // the quiet one
		e.startReflector(top, 0, true)
		for _, name := range []string{"b", "d", "e"} {
			e.waitReflected(t, "web", web, name)
		}
		before := uidsOf(e.remotePods(t, web))
		e.Link.Cut()
		e.WaitStatus(t, "web", "Unreachable", offloadenv.PhaseIs(v1alpha1.OffloadAllFailed, map[string]string{"p1": mirror.ReasonUnreachable}))
		if err := e.Local.Client.CoreV1().Pods("web").Delete(t.Context(), "d", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f := e.createPods(t, e.podOnVirtualNode("web", "f"))[0]
		// The witnesses that the reflector looked: the new pod says what
		// it waits for, and the deletion was tried and failed.
		e.waitEvent(t, f, EventWaiting, mirror.ReasonUnreachable)
		// And it goes on failing for a while: a few retries.
		eventually.Within(t, 60*time.Second, "failed deletes", func() error {
			if n := testutil.ToFloat64(e.reflector().m.errors.WithLabelValues(e.Provider.ID, offload.ErrUnreachable)); n < 6 {
				return fmt.Errorf("%v so far", n)
			}
			return nil
		})
		remote := e.remotePods(t, web)
		for name, uid := range before {
			if p := remote[name]; p == nil || p.UID != uid || p.DeletionTimestamp != nil {
				t.Errorf("pod %s on the provider was deleted while it was unreachable", name)
			}
		}
		for _, name := range []string{"b", "e"} {
			if p, ok := e.localPod(t, "web", name); !ok || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				t.Errorf("local pod %s changed while the provider was unreachable", name)
			}
		}
		if p, ok := e.localPod(t, "web", "d"); !ok {
			t.Errorf("local pod d went before its provider's pod")
		} else if p.DeletionTimestamp == nil {
			t.Errorf("local pod d is not being deleted")
		}
		e.Link.Restore(t)
		e.waitReflected(t, "web", web, "f")
		e.waitGonePod(t, web, "d", "there")
		e.waitGonePod(t, "web", "d", "here")
		remote = e.remotePods(t, web)
		for _, name := range []string{"b", "e"} {
			if p := remote[name]; p == nil || p.UID != before[name] {
				t.Errorf("pod %s on the provider was replaced", name)
			}
		}
	})

	t.Run("Metrics", func(t *testing.T) {
		list, err := e.Local.Client.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + e.Node})
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		peer := map[string]string{"peer": e.Provider.ID}
		if m := offloadtest.MetricOf(t, e.registry, "flotilla_offloaded_pods", map[string]string{"peer": e.Provider.ID, "phase": "Running"}); m == nil || int(m.GetGauge().GetValue()) != running {
			t.Errorf("flotilla_offloaded_pods{phase=Running} %v, want %d", m, running)
		}
		for _, kind := range []string{lagPod, lagPodStatus} {
			peer["kind"] = kind
			if m := offloadtest.MetricOf(t, e.registry, "flotilla_reflection_lag_seconds", peer); m == nil || m.GetHistogram().GetSampleCount() == 0 {
				t.Errorf("no flotilla_reflection_lag_seconds{kind=%q}", kind)
			} else {
				t.Logf("reflection lag %s: %d samples, %.1f ms on average", kind, m.GetHistogram().GetSampleCount(),
					1000*m.GetHistogram().GetSampleSum()/float64(m.GetHistogram().GetSampleCount()))
			}
		}
	})
}

package reflection

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/offloadenv"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/test/harness"
)

// reflectEnv is an offloadenv.PodEnv (consumer and provider, real
// control planes, a real grant, namespace mirroring running) with
// namespace ns offloaded and Ready there as remote, and a Reflector
// running with the agent's own token (deploy/'s RBAC on the consumer).
type reflectEnv struct {
	*offloadenv.PodEnv
	ns, remote string
	// agent reaches the consumer with a token of the agent's account;
	// requests records what the Reflector asked of it.
	agent    *rest.Config
	requests *harness.Requests
	// recheck is the Reflectors' RecheckRights (0: the default).
	recheck time.Duration
	// lcx and pcx reach the consumer and the provider as administrators,
	// with every kind reflected in their scheme.
	lcx, pcx   client.Client
	reflectors []*Reflector
	registry   *prometheus.Registry
	stop       func()
	// shared is what the reflectors read NamespaceOffloads, Services and
	// EndpointSlices from, as in the agent; it outlives each of them.
	shared *offload.SharedCache
}

func newReflectEnv(tb testing.TB, workers int) *reflectEnv {
	return newReflectEnvWith(tb, workers, offloadenv.ConsumerLimits)
}

// newReflectEnvWith is newReflectEnv with the grant's terms limits,
// which set the quota of the namespace mirrored for it.
func newReflectEnvWith(tb testing.TB, workers int, limits grant.Limits) *reflectEnv {
	e := newReflectClients(tb)
	e.Grants.Set(e.Self, limits)
	e.remote = e.offloadReady(tb, e.ns)
	e.start(tb, workers)
	// The witness that the Reflector watches the namespace there: what
	// changes from now on is reflected as a change, not found at start.
	e.create(tb, optIn("reflector-ready", nil))
	waitRemote(tb, e, &corev1.ConfigMap{}, "reflector-ready", nil)
	return e
}

// newReflectClients is a reflectEnv not offloaded yet, no Reflector
// running: its offloadenv.PodEnv and its clients.
func newReflectClients(tb testing.TB) *reflectEnv {
	e := &reflectEnv{PodEnv: offloadenv.NewPodEnv(tb, offloadenv.PodEnvOptions{}), ns: "app"}
	offloadtest.InstallConsumer(tb, e.Local)
	e.agent = offloadtest.ServiceAccountConfig(tb, e.Local, "flotilla-system", "flotilla-agent")
	e.agent.QPS, e.agent.Burst = -1, -1
	var err error
	if e.lcx, err = client.New(e.Local.Config, client.Options{Scheme: reflectScheme()}); err != nil {
		tb.Fatal(err)
	}
	if e.pcx, err = client.New(e.Provider.CP.Config, client.Options{Scheme: reflectScheme()}); err != nil {
		tb.Fatal(err)
	}
	return e
}

func (e *reflectEnv) start(tb testing.TB, workers int) {
	tb.Helper()
	e.registry = prometheus.NewRegistry()
	var local *rest.Config
	local, e.requests = harness.RecordRequests(e.agent, nil)
	if e.shared == nil {
		e.shared = offloadtest.StartSharedCache(tb, local, nil)
	}
	r, err := NewReflector(ReflectorConfig{
		Config: local, Self: e.Self, Credentials: e.Creds, Views: e.Views, Peers: e.shared,
		Logger:  slog.New(slog.NewTextHandler(offloadtest.LogWriter{T: tb}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: e.registry, Workers: workers, RecheckRights: e.recheck,
	})
	if err != nil {
		tb.Fatal(err)
	}
	e.reflectors = append(e.reflectors, r)
	e.stop = offloadtest.RunUntilCleanup(tb, "Reflector", r.Run)
}

// offloadReady offloads namespace ns, as `flotilla offload namespace`
// does: the RoleBinding that lets the agent read its ConfigMaps and
// Secrets, then the NamespaceOffload, Ready on the provider. It returns
// the namespace's name there.
func (e *reflectEnv) offloadReady(tb testing.TB, ns string) string {
	tb.Helper()
	e.bindReflection(tb, ns)
	return e.OffloadReady(tb, ns)
}

// bindReflection makes the RoleBinding flotilla-reflection in ns, with
// the consumer's admin rights; it creates ns if need be.
func (e *reflectEnv) bindReflection(tb testing.TB, ns string) {
	tb.Helper()
	err := e.LocalAdmin.Create(tb.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	b, err := offload.ReflectionRoleBinding(ns, offload.AgentServiceAccount)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := e.Local.Client.RbacV1().RoleBindings(ns).Create(tb.Context(), b, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// boundPod creates a pod bound to the virtual node, with volumes (and
// whatever else mutate sets).
func (e *reflectEnv) boundPod(tb testing.TB, name string, mutate func(*corev1.PodSpec)) {
	tb.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}, Spec: corev1.PodSpec{
		NodeName:    e.Node,
		Containers:  []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		Tolerations: []corev1.Toleration{{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists}},
	}}
	mutate(&p.Spec)
	harness.Restricted(&p.Spec)
	if err := e.lcx.Create(tb.Context(), p); err != nil {
		tb.Fatal(err)
	}
}

func (e *reflectEnv) create(tb testing.TB, obj client.Object) {
	tb.Helper()
	obj.SetNamespace(e.ns)
	if err := e.lcx.Create(tb.Context(), obj); err != nil {
		tb.Fatal(err)
	}
}

// waitRemote waits until the provider's object name in the mirrored
// namespace satisfies check (nil: it exists) and returns it.
func waitRemote[T client.Object](tb testing.TB, e *reflectEnv, obj T, name string, check func(T) error) T {
	tb.Helper()
	eventually.Within(tb, 30*time.Second, fmt.Sprintf("%T %s on the provider", obj, name), func() error {
		if err := e.pcx.Get(tb.Context(), client.ObjectKey{Namespace: e.remote, Name: name}, obj); err != nil {
			return err
		}
		if check != nil {
			return check(obj)
		}
		return nil
	})
	return obj
}

// waitRemoteGone waits until the provider has no object name.
func (e *reflectEnv) waitRemoteGone(tb testing.TB, obj client.Object, name string) {
	tb.Helper()
	eventually.Within(tb, 30*time.Second, fmt.Sprintf("%T %s gone from the provider", obj, name), func() error {
		err := e.pcx.Get(tb.Context(), client.ObjectKey{Namespace: e.remote, Name: name}, obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there: %v", obj.GetAnnotations())
	})
}

func (e *reflectEnv) remoteAbsent(tb testing.TB, obj client.Object, name string) {
	tb.Helper()
	err := e.pcx.Get(tb.Context(), client.ObjectKey{Namespace: e.remote, Name: name}, obj)
	if !apierrors.IsNotFound(err) {
		tb.Fatalf("%T %s on the provider: %v, want not found (labels %v)", obj, name, err, obj.GetLabels())
	}
}

func reflectedFrom(ns, name string) func(client.Object) error {
	return func(o client.Object) error {
		if gotNS, gotName, ok := reflectedOrigin(o); !ok || gotNS != ns || gotName != name {
			return fmt.Errorf("not marked as reflected from %s/%s: labels %v, annotations %v", ns, name, o.GetLabels(), o.GetAnnotations())
		}
		return nil
	}
}

func configMapData(key, value string) func(*corev1.ConfigMap) error {
	return func(cm *corev1.ConfigMap) error {
		if err := reflectedFrom("app", cm.Name)(cm); err != nil {
			return err
		}
		if cm.Data[key] != value {
			return fmt.Errorf("data %v, want %s=%s", cm.Data, key, value)
		}
		return nil
	}
}

func optIn(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{offload.AnnotationReflect: "true"}}, Data: data}
}

func TestReflection(t *testing.T) {
	// One worker: what is queued first is reflected first, the witness
	// that a later object's reflection follows an earlier one's decision.
	e := newReflectEnv(t, 1)
	ctx := t.Context()

	t.Run("referenced ConfigMap and Secret appear, unreferenced ones do not", func(t *testing.T) {
		e.create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "unreferenced"}, Data: map[string]string{"k": "v"}})
		e.create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"k": "v1"}})
		e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec"}, StringData: map[string]string{"password": "s3cret"}})
		e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull"}, Type: corev1.SecretTypeDockerConfigJson,
			StringData: map[string]string{corev1.DockerConfigJsonKey: `{"auths":{}}`}})
		e.boundPod(t, "web", func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}}}}}
			s.Containers[0].Env = []corev1.EnvVar{{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "password"}}}}
			s.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "pull"}}
		})
		waitRemote(t, e, &corev1.ConfigMap{}, "cfg", configMapData("k", "v1"))
		waitRemote(t, e, &corev1.Secret{}, "sec", func(s *corev1.Secret) error {
			if err := reflectedFrom(e.ns, "sec")(s); err != nil {
				return err
			}
			if string(s.Data["password"]) != "s3cret" {
				return fmt.Errorf("data %v", s.Data)
			}
			return nil
		})
		waitRemote(t, e, &corev1.Secret{}, "pull", func(s *corev1.Secret) error {
			if s.Type != corev1.SecretTypeDockerConfigJson {
				return fmt.Errorf("type %s", s.Type)
			}
			return reflectedFrom(e.ns, "pull")(s)
		})
		e.remoteAbsent(t, &corev1.ConfigMap{}, "unreferenced")
	})

	t.Run("an update reaches the provider", func(t *testing.T) {
		var cm corev1.ConfigMap
		if err := e.lcx.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "cfg"}, &cm); err != nil {
			t.Fatal(err)
		}
		cm.Data["k"] = "v2"
		if err := e.lcx.Update(ctx, &cm); err != nil {
			t.Fatal(err)
		}
		waitRemote(t, e, &corev1.ConfigMap{}, "cfg", configMapData("k", "v2"))
		// Observed once the write returns, which may be after the
		// provider's watch showed it.
		eventually.Within(t, 10*time.Second, "lag observed", func() error {
			if n := e.metricSum(t, "flotilla_object_reflection_lag_seconds", kindConfigMap); n < 2 {
				return fmt.Errorf("ConfigMap reflection lag observed %v times, want the creation and the update", n)
			}
			return nil
		})
		if n := e.metricSum(t, "flotilla_reflected_objects", kindConfigMap); n < 1 {
			t.Fatalf("flotilla_reflected_objects{kind=ConfigMap} = %v, want at least cfg", n)
		}
	})

	t.Run("the opt-in annotation reflects an unreferenced ConfigMap", func(t *testing.T) {
		e.create(t, optIn("opted-in", map[string]string{"k": "in"}))
		waitRemote(t, e, &corev1.ConfigMap{}, "opted-in", configMapData("k", "in"))
	})

	t.Run("service account token Secrets are never reflected", func(t *testing.T) {
		e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "token", Annotations: map[string]string{
			corev1.ServiceAccountNameKey: "default", offload.AnnotationReflect: "true"}}, Type: corev1.SecretTypeServiceAccountToken})
		e.boundPod(t, "token-user", func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "token"}}}}
		})
		// Queued after the token and its pod: with one worker, decided
		// after them.
		e.create(t, optIn("after-token", nil))
		waitRemote(t, e, &corev1.ConfigMap{}, "after-token", nil)
		e.remoteAbsent(t, &corev1.Secret{}, "token")
	})

	t.Run("a reference removed deletes the reflection", func(t *testing.T) {
		zero := int64(0)
		if err := e.lcx.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "web"}},
			&client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		e.waitRemoteGone(t, &corev1.ConfigMap{}, "cfg")
		e.waitRemoteGone(t, &corev1.Secret{}, "sec")
		e.waitRemoteGone(t, &corev1.Secret{}, "pull")
		// Opted in: stays; deleted here: goes.
		waitRemote(t, e, &corev1.ConfigMap{}, "opted-in", nil)
		if err := e.lcx.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "opted-in"}}); err != nil {
			t.Fatal(err)
		}
		e.waitRemoteGone(t, &corev1.ConfigMap{}, "opted-in")
	})

	t.Run("a foreign object is left alone and the condition says so", func(t *testing.T) {
		theirs := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.remote, Name: "taken"}, Data: map[string]string{"k": "theirs"}}
		if err := e.pcx.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		e.create(t, optIn("taken", map[string]string{"k": "ours"}))
		e.WaitStatus(t, e.ns, "Reflected False, ForeignObject", reflectedCondition(e.Provider.ID, metav1.ConditionFalse, v1alpha1.ReasonForeignObject, "ConfigMap taken"))
		got := waitRemote(t, e, &corev1.ConfigMap{}, "taken", nil)
		if got.Data["k"] != "theirs" || got.Labels[offload.LabelReflected] != "" || got.UID != theirs.UID {
			t.Fatalf("foreign ConfigMap touched: %v %v", got.Labels, got.Data)
		}
		// The mirror controller writes the status too; ours stays.
		o := e.WaitStatus(t, e.ns, "Ready", offloadenv.PhaseIs(v1alpha1.OffloadReady, map[string]string{"p1": "Created"}))
		if c := meta.FindStatusCondition(offload.FindCluster(o.Status.Clusters, e.Provider.ID).Conditions, v1alpha1.ConditionReflected); c == nil || c.Status != metav1.ConditionFalse {
			t.Fatalf("Reflected condition lost: %s", offloadenv.DescribeOffload(o))
		}
		// Gone there: ours is made, and the condition clears.
		if err := e.pcx.Delete(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		waitRemote(t, e, &corev1.ConfigMap{}, "taken", configMapData("k", "ours"))
		e.WaitStatus(t, e.ns, "Reflected True", reflectedCondition(e.Provider.ID, metav1.ConditionTrue, v1alpha1.ReasonReflected, ""))
	})

	t.Run("Services and EndpointSlices are reflected with translated addresses", func(t *testing.T) {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Labels: map[string]string{"app": "api"}}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "api"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt(8080), Protocol: corev1.ProtocolTCP}},
		}}
		e.create(t, svc)
		ready := true
		e.create(t, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "api-manual", Labels: map[string]string{
				discoveryv1.LabelServiceName: "api", discoveryv1.LabelManagedBy: "test"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: offloadtest.Ptr("http"), Port: offloadtest.Ptr(int32(8080)), Protocol: offloadtest.Ptr(corev1.ProtocolTCP)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: offloadtest.Ptr("worker")},
				{Addresses: []string{"10.70.3.4"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: offloadtest.Ptr(e.Node)},
				{Addresses: []string{"10.99.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: offloadtest.Ptr(offload.VirtualNodeName("third"))},
			},
		})
		remote := waitRemote(t, e, &corev1.Service{}, "api", func(s *corev1.Service) error {
			if err := reflectedFrom(e.ns, "api")(s); err != nil {
				return err
			}
			if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.Selector != nil || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].NodePort != 0 || s.Spec.Ports[0].Port != 80 {
				return fmt.Errorf("spec %+v", s.Spec)
			}
			return nil
		})
		// The provider's own, by which its pods reach the Service.
		if remote.Spec.ClusterIP == "" || remote.Spec.ClusterIP == corev1.ClusterIPNone {
			t.Fatalf("remote ClusterIP %q: want one the provider allocated", remote.Spec.ClusterIP)
		}
		waitRemote(t, e, &discoveryv1.EndpointSlice{}, "api-manual", func(s *discoveryv1.EndpointSlice) error {
			if err := reflectedFrom(e.ns, "api-manual")(s); err != nil {
				return err
			}
			if s.Labels[discoveryv1.LabelServiceName] != "api" || s.Labels[discoveryv1.LabelManagedBy] != offload.ReflectionManagedBy {
				return fmt.Errorf("labels %v", s.Labels)
			}
			var addrs []string
			for _, ep := range s.Endpoints {
				addrs = append(addrs, ep.Addresses...)
				if ep.Conditions.Ready == nil || !*ep.Conditions.Ready {
					return fmt.Errorf("endpoint %v not ready", ep.Addresses)
				}
			}
			if !slices.Equal(addrs, []string{"10.80.1.5", "10.0.3.4"}) {
				return fmt.Errorf("addresses %v, want 10.80.1.5 (ours, as the provider sees it) and 10.0.3.4 (its own pod)", addrs)
			}
			return nil
		})
		// Counted once the write returns, which may be after the
		// provider's watch showed it.
		eventually.Within(t, 10*time.Second, "dropped endpoint counted", func() error {
			if n := testutil.ToFloat64(e.reflectors[len(e.reflectors)-1].m.dropped.WithLabelValues(e.Provider.ID, dropThirdCluster)); n < 1 {
				return fmt.Errorf("dropped third-cluster endpoints counted %v, want at least 1", n)
			}
			return nil
		})
	})

	t.Run("a Service deleted takes its reflected slices along", func(t *testing.T) {
		if err := e.lcx.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "api"}}); err != nil {
			t.Fatal(err)
		}
		e.waitRemoteGone(t, &corev1.Service{}, "api")
		// The manual slice stays here (no owner), but goes there; the
		// controller's goes here, then there.
		e.waitRemoteGone(t, &discoveryv1.EndpointSlice{}, "api-manual")
		eventually.Within(t, 30*time.Second, "every slice of Service api gone from the provider", func() error {
			var l discoveryv1.EndpointSliceList
			if err := e.pcx.List(ctx, &l, client.InNamespace(e.remote), client.MatchingLabels{discoveryv1.LabelServiceName: "api"}); err != nil {
				return err
			}
			if len(l.Items) > 0 {
				return fmt.Errorf("%d left, %s first", len(l.Items), l.Items[0].Name)
			}
			return nil
		})
	})

	t.Run("a restart rewrites and duplicates nothing", func(t *testing.T) {
		before := e.remoteObjects(t)
		e.stop()
		e.start(t, 1)
		e.create(t, optIn("after-restart", nil))
		waitRemote(t, e, &corev1.ConfigMap{}, "after-restart", nil)
		after := e.remoteObjects(t)
		delete(after, "ConfigMap/after-restart")
		if !maps.Equal(before, after) {
			t.Fatalf("reflected objects changed across a restart:\nbefore %v\nafter  %v", before, after)
		}
	})
}

// Un-offloading a namespace removes everything reflected for it there:
// the provider deletes the mirrored namespace with its contents, and
// the Reflector writes nothing more in it.
func TestReflectionEndsWithTheOffload(t *testing.T) {
	// One worker: the witness below is decided after the change before.
	e := newReflectEnv(t, 1)
	ctx := t.Context()
	other := e.offloadReady(t, "other")
	e.create(t, optIn("cfg", map[string]string{"k": "v"}))
	waitRemote(t, e, &corev1.ConfigMap{}, "cfg", configMapData("k", "v"))
	if err := e.LocalAdmin.Delete(ctx, &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "offload"}}); err != nil {
		t.Fatal(err)
	}
	e.WaitGone(t, e.ns)
	eventually.Within(t, 60*time.Second, "namespace "+e.remote+" gone from the provider", func() error {
		var ns corev1.Namespace
		err := e.pcx.Get(ctx, client.ObjectKey{Name: e.remote}, &ns)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there, phase %s", ns.Status.Phase)
	})
	// A change here after that reaches nothing there: the namespace
	// stays gone, and the local object keeps its data.
	var cm corev1.ConfigMap
	if err := e.lcx.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "cfg"}, &cm); err != nil {
		t.Fatal(err)
	}
	cm.Data["k"] = "after"
	if err := e.lcx.Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	witness := optIn("witness", nil)
	witness.Namespace = "other"
	if err := e.lcx.Create(ctx, witness); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 30*time.Second, "witness reflected into "+other, func() error {
		return e.pcx.Get(ctx, client.ObjectKey{Namespace: other, Name: "witness"}, &corev1.ConfigMap{})
	})
	if n := testutil.ToFloat64(e.reflectors[0].m.errors.WithLabelValues(kindConfigMap, e.Provider.ID, offload.ErrForbidden)); n != 0 {
		t.Fatalf("%v forbidden writes counted: the Reflector wrote into a namespace no longer offloaded", n)
	}
	// Its ConfigMaps and Secrets are no longer watched nor held.
	eventually.Within(t, 10*time.Second, "no cache of "+e.ns+"'s ConfigMaps and Secrets", func() error {
		o := e.reflectors[0].objects
		o.mu.Lock()
		defer o.mu.Unlock()
		if st, ok := o.spaces[e.ns]; ok {
			return fmt.Errorf("still kept: %+v", st)
		}
		if _, ok := o.spaces["other"]; !ok {
			return fmt.Errorf("namespace other, still offloaded, not kept")
		}
		return nil
	})
}

// metricSum is the sum over the series of metric name with label kind:
// the sample count of a histogram, the value of a gauge or counter.
func (e *reflectEnv) metricSum(tb testing.TB, name, kind string) float64 {
	tb.Helper()
	families, err := e.registry.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "kind" && l.GetValue() == kind }) {
				continue
			}
			switch {
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// remoteObjects are the reflected objects on the provider: kind/name ->
// uid/resourceVersion.
func (e *reflectEnv) remoteObjects(tb testing.TB) map[string]string {
	tb.Helper()
	out := map[string]string{}
	sel := client.MatchingLabels{offload.LabelReflected: "true"}
	for kind, list := range map[string]client.ObjectList{
		kindConfigMap: &corev1.ConfigMapList{}, kindSecret: &corev1.SecretList{},
		kindService: &corev1.ServiceList{}, kindEndpointSlice: &discoveryv1.EndpointSliceList{},
	} {
		if err := e.pcx.List(tb.Context(), list, client.InNamespace(e.remote), sel); err != nil {
			tb.Fatal(err)
		}
		items, _ := meta.ExtractList(list)
		for _, it := range items {
			o := it.(client.Object)
			out[kind+"/"+o.GetName()] = string(o.GetUID()) + "/" + o.GetResourceVersion()
		}
	}
	return out
}

// reflectedCondition checks the Reflected condition of provider's entry.
func reflectedCondition(provider string, status metav1.ConditionStatus, reason, inMessage string) func(*v1alpha1.NamespaceOffload) error {
	return func(o *v1alpha1.NamespaceOffload) error {
		c := offload.FindCluster(o.Status.Clusters, provider)
		if c == nil {
			return fmt.Errorf("no entry for %s", provider)
		}
		cond := meta.FindStatusCondition(c.Conditions, v1alpha1.ConditionReflected)
		if cond == nil || cond.Status != status || cond.Reason != reason || !strings.Contains(cond.Message, inMessage) {
			return fmt.Errorf("Reflected condition %+v, want %s %s with %q", cond, status, reason, inMessage)
		}
		return nil
	}
}

package podsync

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
)

// localPodAsAdmitted is a pod as the consumer's API server holds it once
// the scheduler bound it to a virtual node: its token volume and mount,
// the webhook's toleration and affinity, a priority class.
func localPodAsAdmitted() *corev1.Pod {
	token := corev1.Volume{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}
	data := corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: token.Name, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "shop", Name: "web-1", UID: "u-1",
			Labels:          map[string]string{"app": "web", offload.LabelTenant: "forged", v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue},
			Annotations:     map[string]string{"team": "a", corev1.LastAppliedConfigAnnotation: "{...}"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "rs"}},
		},
		Spec: corev1.PodSpec{
			NodeName: "flotilla-cprovider", NodeSelector: map[string]string{offload.LabelClusterID: "cprovider"},
			SchedulerName: "default-scheduler",
			Affinity: &corev1.Affinity{
				NodeAffinity:    &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{}},
				PodAntiAffinity: &corev1.PodAntiAffinity{},
			},
			Tolerations: []corev1.Toleration{
				{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
			},
			HostNetwork: true, HostPID: true, HostIPC: true,
			Priority: new(int32(1000)), PriorityClassName: "high", PreemptionPolicy: new(corev1.PreemptLowerPriority),
			Overhead:           corev1.ResourceList{},
			ServiceAccountName: "web", DeprecatedServiceAccount: "web",
			Volumes:        []corev1.Volume{data, token},
			InitContainers: []corev1.Container{{Name: "init", Image: "i", VolumeMounts: slices.Clone(mounts)}},
			Containers:     []corev1.Container{{Name: "app", Image: "a", VolumeMounts: slices.Clone(mounts)}},
		},
	}
}

func TestRemotePodIsCleaned(t *testing.T) {
	local := localPodAsAdmitted()
	kept := local.DeepCopy()
	got := remotePod(local, "shop-abcdef", "p-1")
	if !apiequality.Semantic.DeepEqual(local, kept) {
		t.Fatal("remotePod changed the local pod")
	}
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "shop-abcdef", Name: "web-1",
			// The provider's markers are refused from a consumer; the
			// provider it was made for is said.
			Labels:      map[string]string{"app": "web", offload.LabelProvider: "p-1"},
			Annotations: map[string]string{"team": "a", offload.AnnotationOrigin: "shop/web-1/u-1"},
		},
		Spec: corev1.PodSpec{
			Affinity:                     &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{}},
			Tolerations:                  []corev1.Toleration{{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			ServiceAccountName:           "default",
			AutomountServiceAccountToken: new(false),
			Volumes:                      []corev1.Volume{local.Spec.Volumes[0]},
			InitContainers:               []corev1.Container{{Name: "init", Image: "i", VolumeMounts: local.Spec.Containers[0].VolumeMounts[:1]}},
			Containers:                   []corev1.Container{{Name: "app", Image: "a", VolumeMounts: local.Spec.Containers[0].VolumeMounts[:1]}},
		},
	}
	if !apiequality.Semantic.DeepEqual(got, want) {
		t.Errorf("remote pod\n%+v\nwant\n%+v", got, want)
	}
}

func TestRemotePodWithoutAffinityOrTolerations(t *testing.T) {
	local := localPodAsAdmitted()
	local.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}}
	local.Spec.Tolerations = local.Spec.Tolerations[:1]
	got := remotePod(local, "ns", "p-1")
	if got.Spec.Affinity != nil || got.Spec.Tolerations != nil {
		t.Errorf("affinity %+v, tolerations %+v: want none left", got.Spec.Affinity, got.Spec.Tolerations)
	}
}

// The provider's pod network 10.0.0.0/16 is 10.70.0.0/16 here.
func translateTest(a netip.Addr) (netip.Addr, bool) {
	return offloadtest.OffsetViews{Provider: "p", Real: offloadtest.ProviderPodCIDR, View: offloadtest.ViewOfProviderPods}.Translate("p", a)
}

func TestReflectedStatus(t *testing.T) {
	host := netip.MustParseAddr("192.0.2.10")
	start := metav1.Now()
	scheduledHere := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}
	disruption := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}
	for _, tc := range []struct {
		name         string
		local        corev1.PodStatus
		remote       corev1.PodStatus
		want         corev1.PodStatus
		untranslated []string
	}{{
		name:   "not started there: the local conditions stay",
		local:  corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBestEffort, Conditions: []corev1.PodCondition{scheduledHere}},
		remote: corev1.PodStatus{Phase: corev1.PodPending},
		want:   corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBestEffort, Conditions: []corev1.PodCondition{scheduledHere}},
	}, {
		name: "running: translated, host the virtual node, the provider's conditions first",
		local: corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBestEffort,
			Conditions: []corev1.PodCondition{scheduledHere, disruption}},
		remote: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "172.18.0.3", HostIPs: []corev1.HostIP{{IP: "172.18.0.3"}},
			PodIP: "10.0.2.7", PodIPs: []corev1.PodIP{{IP: "10.0.2.7"}}, StartTime: &start, QOSClass: corev1.PodQOSGuaranteed,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue, Reason: "there"}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true}}},
		want: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "192.0.2.10", HostIPs: []corev1.HostIP{{IP: "192.0.2.10"}},
			PodIP: "10.70.2.7", PodIPs: []corev1.PodIP{{IP: "10.70.2.7"}}, StartTime: &start, QOSClass: corev1.PodQOSBestEffort,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, Reason: "there"}, disruption},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true}}},
	}, {
		name:         "an address in no view is left out",
		local:        corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.70.2.7", PodIPs: []corev1.PodIP{{IP: "10.70.2.7"}}},
		remote:       corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "172.18.0.3", PodIP: "10.9.0.1"},
		want:         corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "192.0.2.10", HostIPs: []corev1.HostIP{{IP: "192.0.2.10"}}},
		untranslated: []string{"10.9.0.1"},
	}, {
		name:         "dual stack: the translatable one comes first",
		remote:       corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "fd00::7", PodIPs: []corev1.PodIP{{IP: "fd00::7"}, {IP: "10.0.0.9"}}},
		want:         corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.70.0.9", PodIPs: []corev1.PodIP{{IP: "10.70.0.9"}}},
		untranslated: []string{"fd00::7"},
	}, {
		name:   "finished there",
		local:  corev1.PodStatus{Phase: corev1.PodRunning},
		remote: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "the node was low on memory"},
		want:   corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "the node was low on memory"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			local := &corev1.Pod{Status: tc.local}
			got, untranslated := reflectedStatus(local, &corev1.Pod{Status: tc.remote}, translateTest, host)
			if !apiequality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("status\n%+v\nwant\n%+v", got, tc.want)
			}
			if !slices.Equal(untranslated, tc.untranslated) {
				t.Errorf("untranslated %v, want %v", untranslated, tc.untranslated)
			}
			if !apiequality.Semantic.DeepEqual(local.Status, tc.local) {
				t.Error("reflectedStatus changed the local pod")
			}
		})
	}
}

func TestOriginOfRemote(t *testing.T) {
	local := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: "6c1f"}}
	for _, tc := range []struct {
		annotation string
		want       origin
		ok         bool
	}{
		{originOf(local), origin{namespace: "shop", name: "web-1", uid: types.UID("6c1f")}, true},
		{"", origin{}, false},
		{"shop/web-1", origin{}, false},
		{"shop//6c1f", origin{}, false},
		{"shop/web-1/6c1f/more", origin{}, false},
		{"/web-1/6c1f", origin{}, false},
	} {
		remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{offload.AnnotationOrigin: tc.annotation}}}
		got, ok := originOfRemote(remote)
		if ok != tc.ok || got != tc.want {
			t.Errorf("origin %q: %+v %v, want %+v %v", tc.annotation, got, ok, tc.want, tc.ok)
		}
	}
}

// The origin annotation is read from pods the provider holds: whatever it
// says, it parses or is refused, and what parses names it again.
func FuzzOriginOfRemote(f *testing.F) {
	for _, s := range []string{"shop/web-1/6c1f", "", "a/b", "a/b/c/d", "//", "a//c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		remote := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{offload.AnnotationOrigin: s}}}
		o, ok := originOfRemote(remote)
		if !ok {
			return
		}
		if o.namespace == "" || o.name == "" || o.uid == "" {
			t.Fatalf("%q parsed to %+v", s, o)
		}
		again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: o.namespace, Name: o.name, UID: o.uid}}
		if originOf(again) != s {
			t.Fatalf("%q parsed to %+v, which names %q", s, o, originOf(again))
		}
	})
}

// What the caches keep of a pod gives the reconcile back every field it
// reads, and nothing of the spec but where it runs.
func TestKeptPodGivesWhatTheReconcileReads(t *testing.T) {
	now := metav1.Now()
	grace := int64(30)
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web-1", UID: "u1", ResourceVersion: "7",
			DeletionTimestamp: &now, DeletionGracePeriodSeconds: &grace,
			Labels: map[string]string{"app": "web", offload.LabelProvider: "p"}, Annotations: map[string]string{offload.AnnotationOrigin: "app/web-1/u0", "note": "x"}},
		Spec: corev1.PodSpec{NodeName: offload.VirtualNodePrefix + "p", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, tc := range []struct {
		what      string
		transform func(any) (any, error)
		want      *corev1.Pod
	}{
		{"local", localPodTransform, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web-1", UID: "u1", ResourceVersion: "7", DeletionTimestamp: &now, DeletionGracePeriodSeconds: &grace},
			Spec:       corev1.PodSpec{NodeName: full.Spec.NodeName}, Status: full.Status}},
		{"remote", remoteTransform, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web-1", UID: "u1", ResourceVersion: "7", DeletionTimestamp: &now,
				Labels: map[string]string{offload.LabelProvider: "p"}, Annotations: map[string]string{offload.AnnotationOrigin: "app/web-1/u0"}},
			Status: full.Status}},
	} {
		obj, err := tc.transform(full)
		if err != nil {
			t.Fatal(err)
		}
		kept, ok := keptOf(obj)
		if !ok {
			t.Fatalf("%s: the cache keeps a %T", tc.what, obj)
		}
		if got := kept.pod(); !apiequality.Semantic.DeepEqual(got, tc.want) {
			t.Errorf("%s: the reconcile reads\n%+v\nwant\n%+v", tc.what, got, tc.want)
		}
	}
}

package reflection

import (
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestPodRefsNameWhatThePodNeeds(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "a", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-vol"}}}},
			{Name: "b", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s-vol"}}},
			{Name: "c", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-proj"}}},
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "s-proj"}}},
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
			}}}},
			{Name: "d", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			// This cluster's token and CA, which the pod does not take along.
			{Name: offload.ServiceAccountVolumePrefix + "x1", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: rootCAConfigMap}}},
			}}}},
		},
		InitContainers: []corev1.Container{{Name: "i", EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s-init"}}}}}},
		Containers: []corev1.Container{{Name: "c",
			EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-envfrom"}}}},
			Env: []corev1.EnvVar{
				{Name: "A", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-env"}, Key: "k"}}},
				{Name: "B", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s-env"}, Key: "k"}}},
				{Name: "C", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "D", Value: "plain"},
				{Name: "E", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-vol"}, Key: "k"}}},
			}}},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "s-pull"}},
	}}
	var got []string
	for _, r := range podRefs(pod) {
		got = append(got, r.kind+"/"+r.name)
	}
	slices.Sort(got)
	want := []string{"ConfigMap/cm-env", "ConfigMap/cm-envfrom", "ConfigMap/cm-proj", "ConfigMap/cm-vol",
		"Secret/s-env", "Secret/s-init", "Secret/s-proj", "Secret/s-pull", "Secret/s-vol"}
	if !slices.Equal(got, want) {
		t.Fatalf("podRefs = %v, want %v (each once)", got, want)
	}
	// What the reflection's cache keeps of the pod names the same, and
	// its index finds the pod by each on its provider.
	pod.Name, pod.Namespace, pod.Spec.NodeName = "p", "app", offload.VirtualNodePrefix+"x"
	pod.Labels = map[string]string{"app": "web"}
	obj, err := podForReferences(pod)
	if err != nil {
		t.Fatal(err)
	}
	kept := obj.(*referencingPod)
	if kept.Name != "p" || kept.Namespace != "app" || kept.node != pod.Spec.NodeName {
		t.Fatalf("cached pod %s/%s on %q: lost where it runs", kept.Namespace, kept.Name, kept.node)
	}
	got = got[:0]
	for _, r := range kept.refs {
		got = append(got, r.kind+"/"+r.name)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("references of the cached pod = %v, want %v", got, want)
	}
	keys, _ := indexPodRefs(kept)
	if !slices.Contains(keys, podRefKey("x", kindSecret, "app/s-pull")) || len(keys) != len(want) {
		t.Fatalf("index keys %v: want one per reference on provider x", keys)
	}
	// Bound to a node of this cluster, it stays there: nothing of it is
	// reflected, so nothing of what it references is kept.
	pod.Spec.NodeName = "node-1"
	obj, err = podForReferences(pod)
	if err != nil {
		t.Fatal(err)
	}
	if refs := obj.(*referencingPod).refs; len(refs) != 0 {
		t.Fatalf("a pod on a node of this cluster keeps references %v", refs)
	}
}

func TestReflectedServiceHasNoAddressOfOurs(t *testing.T) {
	local := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", UID: "u1",
			Labels:      map[string]string{"app": "web", offload.LabelTenant: "x", "app.kubernetes.io/managed-by": "flotilla"},
			Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "note": "kept"}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "web"},
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, ExternalIPs: []string{"192.0.2.1"},
			LoadBalancerIP: "192.0.2.2", ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31000,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt(8080), NodePort: 30080, Protocol: corev1.ProtocolTCP}},
		},
	}
	s := reflectedService(local, "remote-ns")
	if s.Namespace != "remote-ns" || s.Name != "web" {
		t.Fatalf("reflected as %s/%s", s.Namespace, s.Name)
	}
	if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.Selector != nil || s.Spec.ClusterIP != "" || s.Spec.ClusterIPs != nil ||
		s.Spec.ExternalIPs != nil || s.Spec.LoadBalancerIP != "" || s.Spec.HealthCheckNodePort != 0 || s.Spec.ExternalTrafficPolicy != "" {
		t.Fatalf("reflected spec keeps what is ours: %+v", s.Spec)
	}
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].NodePort != 0 || s.Spec.Ports[0].Port != 80 || s.Spec.Ports[0].TargetPort.IntValue() != 8080 {
		t.Fatalf("ports = %+v, want 80->8080 without node port", s.Spec.Ports)
	}
	if s.Labels[offload.LabelReflected] != "true" || s.Labels[offload.LabelTenant] != "" || s.Labels["app.kubernetes.io/managed-by"] != "" || s.Labels["app"] != "web" {
		t.Fatalf("labels = %v", s.Labels)
	}
	if s.Annotations[offload.AnnotationOrigin] != "app/web/u1" || s.Annotations[corev1.LastAppliedConfigAnnotation] != "" || s.Annotations["note"] != "kept" {
		t.Fatalf("annotations = %v", s.Annotations)
	}
	headless := local.DeepCopy()
	headless.Spec.Type, headless.Spec.ClusterIP = corev1.ServiceTypeClusterIP, corev1.ClusterIPNone
	if h := reflectedService(headless, "r"); h.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("headless Service reflected with clusterIP %q", h.Spec.ClusterIP)
	}
}

func TestReflectedSliceTranslatesOrDrops(t *testing.T) {
	views := offloadtest.OffsetViews{Provider: "p", Real: offloadtest.ProviderPodCIDR, View: offloadtest.ViewOfProviderPods}
	node := func(s string) *string { return &s }
	ready := true
	local := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web-abcde", UID: "u2", Labels: map[string]string{
			discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: offloadtest.Ptr("http"), Port: offloadtest.Ptr(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, NodeName: node("worker"), Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "web-1"}, Zone: offloadtest.Ptr("z1")},
			{Addresses: []string{"10.70.3.4"}, NodeName: node(offload.VirtualNodeName("p"))},
			{Addresses: []string{"10.99.0.1"}, NodeName: node(offload.VirtualNodeName("third"))},
			{Addresses: []string{"192.168.0.1"}, NodeName: node("worker")},
			{Addresses: []string{"not-an-ip"}},
		},
	}
	s, dropped := reflectedSlice(local, "remote-ns", endpointTranslator{provider: "p", views: views})
	var got []string
	for _, e := range s.Endpoints {
		got = append(got, strings.Join(e.Addresses, ","))
		if e.NodeName != nil || e.TargetRef != nil || e.Zone != nil {
			t.Errorf("endpoint %v names this cluster's node, pod or zone", e.Addresses)
		}
	}
	if !slices.Equal(got, []string{"10.80.1.5", "10.0.3.4"}) {
		t.Fatalf("endpoints = %v, want our pod as the provider sees it and the provider's own pod by its address", got)
	}
	if s.Endpoints[0].Conditions.Ready == nil || !*s.Endpoints[0].Conditions.Ready {
		t.Fatalf("ready condition lost: %+v", s.Endpoints[0].Conditions)
	}
	if dropped[dropThirdCluster] != 1 || dropped[dropUntranslatable] != 2 {
		t.Fatalf("dropped = %v, want 1 third_cluster, 2 untranslatable", dropped)
	}
	if s.Labels[discoveryv1.LabelManagedBy] != offload.ReflectionManagedBy || s.Labels[discoveryv1.LabelServiceName] != "web" || s.Labels[offload.LabelReflected] != "true" {
		t.Fatalf("labels = %v", s.Labels)
	}
	if len(s.Ports) != 1 || *s.Ports[0].Port != 8080 {
		t.Fatalf("ports = %+v", s.Ports)
	}
}

// FuzzReflectedOrigin: what a provider's objects say of their origin is
// the provider's to write; nothing in it may pass for ours unless both
// markers are well-formed.
func FuzzReflectedOrigin(f *testing.F) {
	f.Add("true", "app/web/uid")
	f.Add("true", "app/web")
	f.Add("false", "app/web/uid")
	f.Add("true", "//")
	f.Add("true", "a/b/c/d")
	f.Fuzz(func(t *testing.T, label, origin string) {
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{offload.LabelReflected: label}, Annotations: map[string]string{offload.AnnotationOrigin: origin}}}
		ns, name, ok := reflectedOrigin(obj)
		if !ok {
			return
		}
		if label != "true" || ns == "" || name == "" || strings.Contains(ns, "/") || strings.Contains(name, "/") ||
			!strings.HasPrefix(origin, ns+"/"+name+"/") {
			t.Fatalf("reflectedOrigin(%q, %q) = %q, %q, true", label, origin, ns, name)
		}
	})
}

func TestMergedChangesOnlyWhatDiffers(t *testing.T) {
	local := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", UID: "u"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt(80), Protocol: corev1.ProtocolTCP}}}}
	want := reflectedService(local, "r")
	// As the provider holds it: its ClusterIP, its defaults.
	there := want.DeepCopy()
	there.ResourceVersion, there.Spec.ClusterIP, there.Spec.ClusterIPs = "7", "10.1.0.9", []string{"10.1.0.9"}
	if _, changed := merged(there, want); changed {
		t.Fatal("merged reports a change where there is none: a restart would rewrite every object")
	}
	local.Spec.Ports[0].Port = 81
	u, changed := merged(there, reflectedService(local, "r"))
	s := u.(*corev1.Service)
	if !changed || s.Spec.Ports[0].Port != 81 || s.Spec.ClusterIP != "10.1.0.9" || s.ResourceVersion != "7" {
		t.Fatalf("merged = %v, %+v: want the new port, the provider's ClusterIP and resourceVersion kept", changed, s.Spec)
	}
	cm := reflectedConfigMap(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "c", UID: "u"}, Data: map[string]string{"k": "v"}}, "r")
	edited := cm.DeepCopy()
	edited.Data["k"] = "edited there"
	if u, changed := merged(edited, cm); !changed || u.(*corev1.ConfigMap).Data["k"] != "v" {
		t.Fatal("an edit on the provider is not put back")
	}
}

package reflection

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// What a consumer's ConfigMaps, Secrets, Services and EndpointSlices
// become in the namespaces mirrored for it: pure functions, so that the
// reconcile only decides (docs/services.md, "Reflection").

// The kinds reflected, as they name reflectKeys, metrics and messages.
const (
	kindConfigMap     = "ConfigMap"
	kindSecret        = "Secret"
	kindService       = "Service"
	kindEndpointSlice = "EndpointSlice"
	// kindStatus keys the Reflected condition of a namespace on a
	// provider, not an object.
	kindStatus = "status"
)

// objectRef is a ConfigMap or Secret a pod names.
type objectRef struct{ kind, name string }

// podRefs are the ConfigMaps and Secrets pod needs to start: its
// volumes (projected sources too), its containers' env and envFrom, and
// its image pull secrets. Ephemeral containers are not offloaded
// (remoteSpec), so what they name is not either.
func podRefs(pod *corev1.Pod) []objectRef {
	seen := map[objectRef]bool{}
	var out []objectRef
	add := func(kind, name string) {
		r := objectRef{kind, name}
		if name != "" && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if offload.IsServiceAccountTokenVolume(v) {
			continue // this cluster's token and CA: not offloaded (remoteSpec)
		}
		if v.ConfigMap != nil {
			add(kindConfigMap, v.ConfigMap.Name)
		}
		if v.Secret != nil {
			add(kindSecret, v.Secret.SecretName)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ConfigMap != nil {
					add(kindConfigMap, s.ConfigMap.Name)
				}
				if s.Secret != nil {
					add(kindSecret, s.Secret.Name)
				}
			}
		}
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, e := range c.EnvFrom {
				if e.ConfigMapRef != nil {
					add(kindConfigMap, e.ConfigMapRef.Name)
				}
				if e.SecretRef != nil {
					add(kindSecret, e.SecretRef.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if e.ValueFrom.ConfigMapKeyRef != nil {
					add(kindConfigMap, e.ValueFrom.ConfigMapKeyRef.Name)
				}
				if e.ValueFrom.SecretKeyRef != nil {
					add(kindSecret, e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
	}
	for _, s := range pod.Spec.ImagePullSecrets {
		add(kindSecret, s.Name)
	}
	return out
}

// providerOfNode is the provider whose virtual node is node; "" when it
// is no virtual node's name.
func providerOfNode(node string) string {
	if p, ok := strings.CutPrefix(node, offload.VirtualNodePrefix); ok {
		return p
	}
	return ""
}

// reflectedMeta is the metadata of what stands for local on a provider,
// in namespace: its name, labels and annotations, the provider's markers
// left out (its admission refuses them from a consumer), LabelReflected
// and the origin added.
func reflectedMeta(local metav1.Object, namespace string) metav1.ObjectMeta {
	labels := maps.Clone(local.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	delete(labels, offload.LabelTenant)
	if labels[v1alpha1.LabelManagedBy] == v1alpha1.ManagedByValue {
		delete(labels, v1alpha1.LabelManagedBy)
	}
	labels[offload.LabelReflected] = "true"
	annotations := maps.Clone(local.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	// kubectl's copy of the whole object: the consumer's, and large.
	delete(annotations, corev1.LastAppliedConfigAnnotation)
	delete(annotations, offload.AnnotationReflect)
	annotations[offload.AnnotationOrigin] = local.GetNamespace() + "/" + local.GetName() + "/" + string(local.GetUID())
	return metav1.ObjectMeta{Name: local.GetName(), Namespace: namespace, Labels: labels, Annotations: annotations}
}

// reflectedOrigin is the local object (namespace, name) obj stands for;
// false when obj is not one we reflected: both LabelReflected and a
// well-formed origin are needed, or the object is foreign.
func reflectedOrigin(obj metav1.Object) (ns, name string, ok bool) {
	if obj.GetLabels()[offload.LabelReflected] != "true" {
		return "", "", false
	}
	parts := strings.Split(obj.GetAnnotations()[offload.AnnotationOrigin], "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// rootCAConfigMap is published by every cluster in every namespace
// (its API server's CA): the provider has its own, never ours.
const rootCAConfigMap = "kube-root-ca.crt"

// isServiceAccountToken reports whether s holds a token of this
// cluster's: never reflected (docs/services.md, "Service account tokens").
func isServiceAccountToken(s *corev1.Secret) bool {
	return s.Type == corev1.SecretTypeServiceAccountToken
}

func reflectedConfigMap(local *corev1.ConfigMap, namespace string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: reflectedMeta(local, namespace),
		Data:       maps.Clone(local.Data), BinaryData: maps.Clone(local.BinaryData),
		Immutable: local.Immutable,
	}
}

func reflectedSecret(local *corev1.Secret, namespace string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: reflectedMeta(local, namespace),
		Type:       local.Type, Data: maps.Clone(local.Data), Immutable: local.Immutable,
	}
}

// ReflectedNamespaces are the local namespaces whose Services are
// reflected to each provider (provider -> namespaces): those a
// NamespaceOffload not being deleted mirrors there, ready or not yet (the
// Reflector keeps what it reflected while a namespace is not ready). The
// agent's traffic policy allows a Segregated provider what these hold.
func ReflectedNamespaces(offloads []v1alpha1.NamespaceOffload) map[string][]string {
	out := map[string][]string{}
	for i := range offloads {
		o := &offloads[i]
		if o.DeletionTimestamp != nil {
			continue
		}
		for _, c := range o.Status.Clusters {
			if name, _ := offload.MirroredNamespace(o, c.ClusterID); name != "" && !slices.Contains(out[c.ClusterID], o.Namespace) {
				out[c.ClusterID] = append(out[c.ClusterID], o.Namespace)
			}
		}
	}
	return out
}

// ReflectsService reports whether svc, in a namespace offloaded to a
// provider, is reflected there: not one reflected here by another cluster,
// nor this cluster's API server (the provider has its own).
func ReflectsService(svc *corev1.Service) bool {
	return svc.DeletionTimestamp == nil && svc.Labels[offload.LabelReflected] != "true" &&
		!(svc.Namespace == metav1.NamespaceDefault && svc.Name == "kubernetes")
}

// ReflectsSlice reports whether es, in a namespace offloaded to a
// provider, is reflected there while its Service is: it names a Service
// and is not one reflected here.
func ReflectsSlice(es *discoveryv1.EndpointSlice) bool {
	return es.DeletionTimestamp == nil && es.Labels[discoveryv1.LabelServiceName] != "" &&
		es.Labels[discoveryv1.LabelManagedBy] != offload.ReflectionManagedBy && es.Labels[offload.LabelReflected] != "true"
}

// reflectedService is local's Service on a provider: no selector (its
// endpoints are reflected, not selected there), type ClusterIP (or
// headless, or ExternalName, as here), none of this cluster's addresses
// or node ports; the provider allocates its own ClusterIP.
func reflectedService(local *corev1.Service, namespace string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: reflectedMeta(local, namespace)}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	switch {
	case local.Spec.Type == corev1.ServiceTypeExternalName:
		s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, local.Spec.ExternalName
	case local.Spec.ClusterIP == corev1.ClusterIPNone:
		s.Spec.ClusterIP = corev1.ClusterIPNone
	}
	for _, p := range local.Spec.Ports {
		p.NodePort = 0
		s.Spec.Ports = append(s.Spec.Ports, p)
	}
	s.Spec.SessionAffinity = local.Spec.SessionAffinity
	s.Spec.SessionAffinityConfig = local.Spec.SessionAffinityConfig.DeepCopy()
	s.Spec.PublishNotReadyAddresses = local.Spec.PublishNotReadyAddresses
	return s
}

// Reasons of flotilla_reflection_dropped_endpoints_total.
const (
	// dropThirdCluster: the endpoint runs on a third cluster, at an
	// address outside this cluster's views of it (those inside go in a
	// slice of their own, third.go).
	dropThirdCluster = "third_cluster"
	// dropUntranslatable: neither a pod of ours the provider has a view
	// of, nor one of its own.
	dropUntranslatable = "untranslatable"
)

// endpointTranslator translates an endpoint's address for one provider.
type endpointTranslator struct {
	provider string
	views    offload.Views
}

// address is a, as the provider reaches it: a pod of this cluster's
// through the provider's view of us; a pod offloaded to the provider
// (our view of it) as the provider's own address.
func (t endpointTranslator) address(a netip.Addr) (netip.Addr, bool) {
	if v, ok := t.views.AsSeenBy(t.provider, a); ok {
		return v, true
	}
	return t.views.ToRemote(t.provider, a)
}

// reflectedSlice is local's EndpointSlice on a provider: its endpoints'
// addresses translated, those that cannot be left out (dropped, by
// reason); conditions, hostnames and ports kept; what names this
// cluster's nodes and pods cleared.
func reflectedSlice(local *discoveryv1.EndpointSlice, namespace string, t endpointTranslator) (*discoveryv1.EndpointSlice, map[string]int) {
	s := &discoveryv1.EndpointSlice{ObjectMeta: reflectedMeta(local, namespace), AddressType: local.AddressType}
	s.Labels[discoveryv1.LabelManagedBy] = offload.ReflectionManagedBy
	s.Ports = make([]discoveryv1.EndpointPort, 0, len(local.Ports))
	for _, p := range local.Ports {
		s.Ports = append(s.Ports, *p.DeepCopy())
	}
	s.Endpoints = []discoveryv1.Endpoint{}
	dropped := map[string]int{}
	for _, e := range local.Endpoints {
		addrs, ok := make([]string, 0, len(e.Addresses)), true
		for _, a := range e.Addresses {
			ip, err := netip.ParseAddr(a)
			if err == nil {
				ip, ok = t.address(ip)
			}
			if err != nil || !ok {
				ok = false
				break
			}
			addrs = append(addrs, ip.String())
		}
		if !ok || len(addrs) == 0 {
			if _, _, third := t.thirdAddresses(e); third {
				continue // in a slice of its own (third.go)
			}
			reason := dropUntranslatable
			if e.NodeName != nil && providerOfNode(*e.NodeName) != "" && providerOfNode(*e.NodeName) != t.provider {
				reason = dropThirdCluster
			}
			dropped[reason]++
			continue
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: addrs, Conditions: *e.Conditions.DeepCopy(), Hostname: e.Hostname,
		})
	}
	return s, dropped
}

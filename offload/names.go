package offload

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
)

// What a provider creates for a consumer, by name. deploy/ refers to the
// same names (the consumer's ClusterRole, the admission policies).
const (
	// TenantPrefix starts the name of every tenant namespace; the rest is
	// the consumer's cluster ID.
	TenantPrefix = "flotilla-tenant-"
	// LabelTenant carries the consumer's cluster ID on its tenant
	// namespace and on the namespaces mirrored for it.
	LabelTenant = "flotilla.io/tenant"
	// ConsumerServiceAccount is the consumer's account in its tenant
	// namespace; its tokens are the credentials granted.
	ConsumerServiceAccount = "flotilla-consumer"
	// ConsumerClusterRole is what a consumer may do in a namespace of its
	// own (deploy/rbac.yaml); a RoleBinding in each grants it there.
	ConsumerClusterRole = "flotilla-consumer"
	// GrantSecret is the object every token of a grant is bound to:
	// deleting it revokes them all at once.
	GrantSecret = "flotilla-grant"
	// DefaultAudience is the audience of the tokens issued; the provider's
	// kube-apiserver must accept it (--api-audiences).
	DefaultAudience = "flotilla.io/offload"
)

// TenantNamespace is the name of consumer's tenant namespace.
func TenantNamespace(consumer string) string { return TenantPrefix + consumer }

// ConsumerUser is the user name the consumer's tokens authenticate as.
func ConsumerUser(consumer string) string {
	return "system:serviceaccount:" + TenantNamespace(consumer) + ":" + ConsumerServiceAccount
}

// Workload offloading (docs/offload.md): what the consumer's agent puts in
// its own cluster for each provider, and how an offloaded pod is known on
// both sides.
const (
	// VirtualNodePrefix starts the name of every virtual node; the rest is
	// the provider's cluster ID (its Peer's name).
	VirtualNodePrefix = "flotilla-"
	// LabelVirtualNode is "true" on every virtual node; the taint of the
	// same key keeps pods that do not tolerate it off them.
	LabelVirtualNode = v1alpha1.LabelVirtualNode
	// TaintVirtualNode is the key of the NoExecute taint on virtual nodes.
	TaintVirtualNode = LabelVirtualNode
	// LabelClusterID and LabelClusterName name the provider a virtual node
	// stands for; placement selects virtual nodes by LabelClusterID.
	LabelClusterID   = "flotilla.io/cluster-id"
	LabelClusterName = "flotilla.io/cluster-name"
	// LabelOffloaded is "true" on a consumer's namespace while a
	// NamespaceOffload is in it: the placement webhook's namespace
	// selector.
	LabelOffloaded = "flotilla.io/offloaded"
	// AnnotationOrigin is on every pod a consumer creates on a provider:
	// "<namespace>/<name>/<uid>" of the consumer's pod it stands for. The
	// mirrored namespace it is in says whose it is (LabelTenant): the
	// provider's admission refuses our labels from a consumer.
	AnnotationOrigin = "flotilla.io/origin"
	// LabelProvider is on every pod a consumer creates on a provider: the
	// cluster ID of the provider (its virtual node) the pod was made for.
	// Two Peers can reach the same namespace (a provider back under a new
	// identity at the same API server): each reflector keeps to its own
	// pods (docs/offload.md, "A provider back under a new identity").
	LabelProvider = "flotilla.io/provider"
)

// VirtualNodeName is the name of the virtual node that stands for provider.
func VirtualNodeName(provider string) string { return VirtualNodePrefix + provider }

// Reflection (docs/services.md): what a consumer copies into the
// namespaces mirrored for it. Reflected objects carry AnnotationOrigin
// ("<namespace>/<name>/<uid>" of the local object) and LabelReflected;
// an object there without both is foreign and never touched.
const (
	// LabelReflected is "true" on every object a consumer reflects to a
	// provider (a consumer may set flotilla.io labels other than
	// LabelTenant; the provider's admission says so).
	LabelReflected = "flotilla.io/reflected"
	// AnnotationReflect "true" on a ConfigMap or Secret of an offloaded
	// namespace reflects it to the namespace's providers even when no
	// offloaded pod references it.
	AnnotationReflect = "flotilla.io/reflect"
	// ReflectionManagedBy is the endpointslice.kubernetes.io/managed-by
	// value of the EndpointSlices a consumer reflects: the provider's
	// EndpointSlice controller leaves them alone.
	ReflectionManagedBy = "reflection.flotilla.io"
	// AnnotationReachableFrom is on the EndpointSlices a consumer reflects
	// to a provider: the other providers the same namespace is offloaded
	// to, comma-separated cluster IDs. Their offloaded pods reach the
	// Service's endpoints on this provider directly (docs/services.md,
	// "Endpoints on third clusters"); a Segregated provider lets those
	// peers reach the consumer's own pods listed there, on the slice's
	// ports, and nothing else (docs/policy.md).
	AnnotationReachableFrom = "flotilla.io/reachable-from"
)

// Reflection's rights (docs/services.md, "Reflection's rights"): the
// agent reads the ConfigMaps and Secrets of a namespace only where a
// RoleBinding binds it ReflectionClusterRole, made with the rights of
// whoever offloads the namespace; none of any other namespace.
const (
	// ReflectionClusterRole is what the binding grants (deploy/reflection.yaml):
	// get, list and watch ConfigMaps and Secrets.
	ReflectionClusterRole = "flotilla-agent-reflection"
	// ReflectionBinding is the RoleBinding's name in each offloaded
	// namespace.
	ReflectionBinding = "flotilla-reflection"
	// AgentServiceAccount is the agent's account as deploy/ installs it,
	// namespace:name (kubectl's --serviceaccount).
	AgentServiceAccount = "flotilla-system:flotilla-agent"
)

// ReflectionRoleBinding is the RoleBinding that lets account (the
// agent's ServiceAccount, namespace:name) read the ConfigMaps and
// Secrets of ns, labelled as ours.
func ReflectionRoleBinding(ns, account string) (*rbacv1.RoleBinding, error) {
	saNS, saName, ok := strings.Cut(account, ":")
	if !ok || len(validation.IsDNS1123Label(saNS)) > 0 || len(validation.IsDNS1123Subdomain(saName)) > 0 {
		return nil, fmt.Errorf("the agent's account %q: want namespace:name of a ServiceAccount", account)
	}
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ReflectionBinding,
			Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ReflectionClusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNS, Name: saName}},
	}, nil
}

// Endpoints on third clusters (docs/services.md, "Endpoints on third
// clusters"): a consumer's endpoints on a pod it offloaded to another
// provider B reach provider P in B's own addresses, in a slice P's
// kube-proxy ignores; P's agent, which knows its view of B, translates
// them into a slice of its own.
const (
	// LabelEndpointsOf is the cluster ID of B on such a slice (and on the
	// slice P translates from it): the cluster whose own addresses it
	// lists.
	LabelEndpointsOf = "flotilla.io/endpoints-of"
	// LabelServiceName names the Service the slice is for, in place of
	// kubernetes.io/service-name, so that nothing on P routes to the
	// untranslated addresses.
	LabelServiceName = "flotilla.io/service-name"
	// HostedEndpointsManagedBy is the endpointslice.kubernetes.io/managed-by
	// value of the slices P's agent translates: its own, so that neither
	// the EndpointSlice controller nor a consumer's reflection takes them.
	HostedEndpointsManagedBy = "endpoints.flotilla.io"
)

// VirtualNodeLabels are a virtual node's labels, and which of them come
// from the Peer: the labels this cluster's admin gave it, never one of
// Kubernetes' (kubernetes.io, k8s.io) or Flotilla's (flotilla.io)
// domains, which are ours to say.
func VirtualNodeLabels(peer *v1alpha1.Peer, name string) (map[string]string, []string) {
	l := map[string]string{}
	var copied []string
	for k, val := range peer.Labels {
		if ReservedLabelKey(k) || len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(val)) > 0 {
			continue
		}
		l[k] = val
		copied = append(copied, k)
	}
	slices.Sort(copied)
	maps.Copy(l, map[string]string{
		LabelVirtualNode: "true", LabelClusterID: peer.Name,
		v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue,
		corev1.LabelHostname:    name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: runtime.GOARCH,
	})
	if n := peer.Status.ClusterName; n != "" && len(validation.IsValidLabelValue(n)) == 0 {
		l[LabelClusterName] = n
	}
	return l, copied
}

// MirroredLabels mark a namespace mirrored for consumer from its namespace
// source.
func MirroredLabels(consumer, source string) map[string]string {
	l := TenantLabels(consumer)
	l[v1alpha1.LabelMirroredFrom] = source
	return l
}

// MirroredSelector selects the namespaces mirrored for consumer, or for
// any consumer when it is empty.
func MirroredSelector(consumer string) labels.Selector {
	managed, _ := labels.NewRequirement(v1alpha1.LabelManagedBy, selection.Equals, []string{v1alpha1.ManagedByValue})
	tenant, _ := labels.NewRequirement(LabelTenant, selection.Exists, nil)
	if consumer != "" {
		tenant, _ = labels.NewRequirement(LabelTenant, selection.Equals, []string{consumer})
	}
	from, _ := labels.NewRequirement(v1alpha1.LabelMirroredFrom, selection.Exists, nil)
	return labels.NewSelector().Add(*managed, *tenant, *from)
}

func TenantLabels(consumer string) map[string]string {
	return map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, LabelTenant: consumer}
}

func ReservedLabelKey(k string) bool {
	domain, _, ok := strings.Cut(k, "/")
	if !ok {
		return false
	}
	for _, d := range []string{"kubernetes.io", "k8s.io", "flotilla.io"} {
		if domain == d || strings.HasSuffix(domain, "."+d) {
			return true
		}
	}
	return false
}

package podsync

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// What a consumer's pod becomes on its provider, and what the provider's
// pod says back: pure functions, so that the reconcile only decides.

// ReasonNotOffloaded is the status reason of a pod bound to a virtual
// node whose namespace is not offloaded to that provider: it is refused,
// as a kubelet refuses a pod at admission.
const ReasonNotOffloaded = "NotOffloaded"

// originOf is the AnnotationOrigin value of the remote pod standing for
// local.
func originOf(local *corev1.Pod) string {
	return local.Namespace + "/" + local.Name + "/" + string(local.UID)
}

// origin is a parsed AnnotationOrigin: the consumer's pod a remote pod
// stands for.
type origin struct {
	namespace, name string
	uid             types.UID
}

// originOfRemote reads a remote pod's AnnotationOrigin; false when it has
// none or it is malformed (not a pod of ours, whatever its labels say).
func originOfRemote(remote metav1.Object) (origin, bool) {
	return parseOrigin(remote.GetAnnotations()[offload.AnnotationOrigin])
}

// parseOrigin reads an AnnotationOrigin value.
func parseOrigin(value string) (origin, bool) {
	parts := strings.Split(value, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return origin{}, false
	}
	return origin{namespace: parts[0], name: parts[1], uid: types.UID(parts[2])}, true
}

// remotePod is the pod created on provider, in namespace, for local:
// the same name, labels and annotations (with the origin and
// LabelProvider), and a spec cleaned of what cannot hold there. It
// carries no LabelTenant: that label marks what the provider made, and
// its admission refuses it from a consumer (deploy/admission.yaml); the
// namespace, mirrored for this cluster alone, says whose the pod is.
func remotePod(local *corev1.Pod, namespace, provider string) *corev1.Pod {
	labels := make(map[string]string, len(local.Labels))
	for k, v := range local.Labels {
		labels[k] = v
	}
	// The provider's markers, refused from a consumer.
	delete(labels, offload.LabelTenant)
	labels[offload.LabelProvider] = provider
	if labels[v1alpha1.LabelManagedBy] == v1alpha1.ManagedByValue {
		delete(labels, v1alpha1.LabelManagedBy)
	}
	annotations := make(map[string]string, len(local.Annotations)+1)
	for k, v := range local.Annotations {
		annotations[k] = v
	}
	// kubectl's copy of the whole object: the consumer's, and large.
	delete(annotations, corev1.LastAppliedConfigAnnotation)
	annotations[offload.AnnotationOrigin] = originOf(local)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: local.Name, Namespace: namespace, Labels: labels, Annotations: annotations},
		Spec:       remoteSpec(&local.Spec),
	}
}

// remoteSpec is spec without what cannot hold on a provider.
func remoteSpec(local *corev1.PodSpec) corev1.PodSpec {
	s := *local.DeepCopy()
	// Placement on the consumer: the provider's scheduler places the pod
	// among its own nodes; the consumer's scheduler name may not exist
	// there.
	s.NodeName, s.NodeSelector, s.SchedulerName = "", nil, ""
	if s.Affinity != nil {
		s.Affinity.NodeAffinity = nil
		if s.Affinity.PodAffinity == nil && s.Affinity.PodAntiAffinity == nil {
			s.Affinity = nil
		}
	}
	s.Tolerations = slices.DeleteFunc(s.Tolerations, func(t corev1.Toleration) bool { return t.Key == offload.TaintVirtualNode })
	if len(s.Tolerations) == 0 {
		s.Tolerations = nil
	}
	// A tenant never shares its provider's host.
	s.HostNetwork, s.HostPID, s.HostIPC = false, false, false
	// Priority classes are the provider's (its admission sets priority
	// from the class and refuses a priority given without it); the
	// overhead is its RuntimeClass admission's to set.
	s.Priority, s.PriorityClassName, s.PreemptionPolicy = nil, "", nil
	s.Overhead = nil
	// The consumer's account and token mean nothing there: the mirrored
	// namespace's default account, with no token, is the safe side.
	s.ServiceAccountName, s.DeprecatedServiceAccount = "default", ""
	s.AutomountServiceAccountToken = new(bool)
	dropped := map[string]bool{}
	s.Volumes = slices.DeleteFunc(s.Volumes, func(v corev1.Volume) bool {
		if offload.IsServiceAccountTokenVolume(v) {
			dropped[v.Name] = true
			return true
		}
		return false
	})
	for _, cs := range [][]corev1.Container{s.InitContainers, s.Containers} {
		for i := range cs {
			cs[i].VolumeMounts = slices.DeleteFunc(cs[i].VolumeMounts, func(m corev1.VolumeMount) bool { return dropped[m.Name] })
		}
	}
	// Added to a running pod only, by an update the provider's pod gets
	// from nobody.
	s.EphemeralContainers = nil
	return s
}

// reflectedStatus is local's status as remote's says it, in this
// cluster's terms: the pod IPs through translate (those it cannot
// translate are left out and returned), the host IP the virtual node's
// address (host; none when invalid). Conditions the provider does not
// report are kept from local (the consumer's own, say DisruptionTarget).
func reflectedStatus(local, remote *corev1.Pod, translate func(netip.Addr) (netip.Addr, bool), host netip.Addr) (corev1.PodStatus, []string) {
	st := *local.Status.DeepCopy()
	r := remote.Status.DeepCopy()
	st.Phase, st.Reason, st.Message = r.Phase, r.Reason, r.Message
	st.Conditions = mergeConditions(r.Conditions, local.Status.Conditions)
	st.StartTime = r.StartTime
	st.InitContainerStatuses, st.ContainerStatuses, st.EphemeralContainerStatuses =
		r.InitContainerStatuses, r.ContainerStatuses, r.EphemeralContainerStatuses
	st.HostIP, st.HostIPs = "", nil
	if r.HostIP != "" && host.IsValid() {
		st.HostIP = host.String()
		st.HostIPs = []corev1.HostIP{{IP: st.HostIP}}
	}
	ips := r.PodIPs
	if len(ips) == 0 && r.PodIP != "" {
		ips = []corev1.PodIP{{IP: r.PodIP}}
	}
	st.PodIP, st.PodIPs = "", nil
	var untranslated []string
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			untranslated = append(untranslated, ip.IP)
			continue
		}
		v, ok := translate(a)
		if !ok {
			untranslated = append(untranslated, ip.IP)
			continue
		}
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: v.String()})
	}
	if len(st.PodIPs) > 0 {
		st.PodIP = st.PodIPs[0].IP
	}
	return st, untranslated
}

// mergeConditions is remote's conditions, then those of local whose type
// remote does not report.
func mergeConditions(remote, local []corev1.PodCondition) []corev1.PodCondition {
	out := slices.Clone(remote)
	for _, c := range local {
		if !slices.ContainsFunc(remote, func(r corev1.PodCondition) bool { return r.Type == c.Type }) {
			out = append(out, c)
		}
	}
	return out
}

// notOffloadedStatus is local's status once refused: Failed, with why.
func notOffloadedStatus(local *corev1.Pod, message string) corev1.PodStatus {
	st := *local.Status.DeepCopy()
	st.Phase, st.Reason, st.Message = corev1.PodFailed, ReasonNotOffloaded, message
	return st
}

// terminal reports whether p has finished (its containers will not run
// again).
func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func untranslatedMessage(provider string, ips []string) string {
	return fmt.Sprintf("the pod's address %s on %s is in no view this cluster has of %s (the peering has not negotiated one yet?): it is left out of the status, and the pod is not reachable from here",
		strings.Join(ips, ", "), provider, provider)
}

package harness

import corev1 "k8s.io/api/core/v1"

// RestrictedUID is the user the test images run as where Pod Security
// restricted holds (a provider's namespaces for its consumers): not root,
// and the images' files are readable by anyone.
const RestrictedUID = 65534

// Restricted makes spec meet Pod Security restricted, as a consumer's
// pods must to run on a provider: not root, the runtime's default
// seccomp profile, no privilege escalation, every capability dropped. It
// changes only what spec leaves unset, and returns it.
func Restricted(spec *corev1.PodSpec) *corev1.PodSpec {
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	sc := spec.SecurityContext
	if sc.RunAsNonRoot == nil {
		sc.RunAsNonRoot = new(bool)
		*sc.RunAsNonRoot = true
	}
	if sc.RunAsUser == nil {
		sc.RunAsUser = new(int64)
		*sc.RunAsUser = RestrictedUID
	}
	if sc.SeccompProfile == nil {
		sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			c := &cs[i]
			if c.SecurityContext == nil {
				c.SecurityContext = &corev1.SecurityContext{}
			}
			if c.SecurityContext.AllowPrivilegeEscalation == nil {
				c.SecurityContext.AllowPrivilegeEscalation = new(bool)
			}
			if c.SecurityContext.Capabilities == nil {
				c.SecurityContext.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
			}
		}
	}
	return spec
}

package offload

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func MetadataOf(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	return m
}

// PatchOp is one operation of a JSON patch (RFC 6902).
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// ServiceAccountVolumePrefix names the projected volume the consumer's
// API server adds for the pod's token: a token of the consumer's cluster,
// of no use on the provider, whose own admission would add one of its own.
const ServiceAccountVolumePrefix = "kube-api-access-"

// IsServiceAccountTokenVolume reports whether v is the token volume the
// consumer's admission added (kube-api-access-*, projected, with a
// service account token).
func IsServiceAccountTokenVolume(v corev1.Volume) bool {
	if !strings.HasPrefix(v.Name, ServiceAccountVolumePrefix) || v.Projected == nil {
		return false
	}
	return slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool { return p.ServiceAccountToken != nil })
}

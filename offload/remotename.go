package offload

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/identity"
)

// Lengths of the parts of a DefaultName: the cluster suffix is six
// characters of the consumer's ID, the hash eight hex digits of the local
// name.
const (
	clusterSuffixLen = 6
	nameHashLen      = 8
)

// RemoteNamespace is the name on a provider of the consumer's namespace
// local under mapping (empty is DefaultName): DefaultName is local plus
// "-" and six characters of the consumer's ID, with local cut and a hash
// of it added when that would pass 63 characters; SameName is local;
// Selected is remoteName. The result is a valid namespace name, or an
// error that says why not. Both sides compute it: the consumer to name its
// request, the provider only to check nothing (it validates what arrives).
func RemoteNamespace(mapping v1alpha1.NamespaceMapping, local, remoteName, consumer string) (string, error) {
	if err := identity.ValidateClusterID(consumer); err != nil {
		return "", fmt.Errorf("remote name of namespace %q: consumer: %w", local, err)
	}
	if err := ValidNamespaceName(local); err != nil {
		return "", fmt.Errorf("remote name of namespace %q: %w", local, err)
	}
	var name string
	switch mapping {
	case v1alpha1.MappingDefaultName, "":
		suffix := ClusterSuffix(consumer)
		name = local + "-" + suffix
		if len(name) > validation.DNS1123LabelMaxLength {
			sum := sha256.Sum256([]byte(local))
			keep := validation.DNS1123LabelMaxLength - 1 - nameHashLen - 1 - clusterSuffixLen
			name = local[:keep] + "-" + hex.EncodeToString(sum[:])[:nameHashLen] + "-" + suffix
		}
	case v1alpha1.MappingSameName:
		name = local
	case v1alpha1.MappingSelected:
		if remoteName == "" {
			return "", fmt.Errorf("remote name of namespace %q: mapping Selected needs a remoteName", local)
		}
		name = remoteName
	default:
		return "", fmt.Errorf("remote name of namespace %q: mapping %q: want %s, %s or %s",
			local, mapping, v1alpha1.MappingDefaultName, v1alpha1.MappingSameName, v1alpha1.MappingSelected)
	}
	if err := ValidNamespaceName(name); err != nil {
		return "", fmt.Errorf("remote name of namespace %q (mapping %s): %w", local, mapping, err)
	}
	return name, nil
}

// ClusterSuffix is the part of consumer's cluster ID that ends the
// names of its namespaces on a provider (DefaultName); consumer is a
// valid cluster ID.
func ClusterSuffix(consumer string) string { return consumer[1 : 1+clusterSuffixLen] }

// Suffixed reports whether name ends in "-" and consumer's ClusterSuffix,
// as DefaultName makes it.
func Suffixed(name, consumer string) bool {
	return len(consumer) > clusterSuffixLen && strings.HasSuffix(name, "-"+ClusterSuffix(consumer))
}

// ValidNamespaceName checks that name is a DNS-1123 label (lowercase
// letters, digits and '-', at most 63 characters), as namespace names are.
func ValidNamespaceName(name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("%q is not a valid namespace name: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// MirroredNamespace is the namespace o's namespace has on provider, and
// whether it is there and ready for this cluster's objects (its Ready
// condition is true).
func MirroredNamespace(o *v1alpha1.NamespaceOffload, provider string) (string, bool) {
	c := FindCluster(o.Status.Clusters, provider)
	if c == nil || c.RemoteNamespace == "" {
		return "", false
	}
	return c.RemoteNamespace, meta.IsStatusConditionTrue(c.Conditions, ConditionReady)
}

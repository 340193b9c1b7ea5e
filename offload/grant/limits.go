// Package grant is what a provider sends a consumer when it lets it
// offload: a short-lived credential for the provider's API server with
// the limits it comes with, signed by the provider and sealed to the
// consumer (Seal, Open), and the consumer's Store of the grants it holds.
// It knows nothing of Kubernetes: offload/tenancy issues what it carries
// and offload/remote uses it.
package grant

import (
	"fmt"
	"regexp"
)

// Limits bound what a consumer may run on a provider. A zero field means
// no limit of that kind.
type Limits struct {
	// CPU and Memory are Kubernetes quantities ("4", "500m", "8Gi"),
	// summed over the requests of the consumer's pods.
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
	// Pods is how many pods the consumer may have at once.
	Pods int64 `json:"pods,omitempty"`
	// Namespaces is how many namespaces the consumer may have mirrored.
	Namespaces int64 `json:"namespaces,omitempty"`

	// Fence is the provider's own side of the terms, never sealed: a
	// consumer of an older version refuses a grant with fields it does not
	// know, and it needs none of them.
	Fence Fence `json:"-"`
}

// Fence is what a provider holds its consumer's namespaces to beyond the
// limits it tells the consumer: object counts per namespace (zero: the
// provider's default) and whether names without the consumer's suffix
// are allowed.
type Fence struct {
	Services, Secrets, ConfigMaps, EndpointSlices, PersistentVolumeClaims int64
	// EphemeralStorage is a Kubernetes quantity, summed over the pods'
	// ephemeral-storage requests in each namespace.
	EphemeralStorage string
	// AnyNamespaceName lets the consumer name its namespaces without the
	// suffix of its cluster ID.
	AnyNamespaceName bool
	// EndpointNetworks are the networks, comma-separated, the consumer's
	// EndpointSlices may point at: the provider's views of the consumer.
	EndpointNetworks string
}

// quantity is the syntax of a non-negative Kubernetes quantity: a decimal
// number with an SI or binary suffix or a decimal exponent.
var quantity = regexp.MustCompile(`^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$`)

const maxQuantityLength = 64

// Validate checks the limits' syntax: quantities as Kubernetes writes
// them, counts not negative. Whether a quantity fits its resource is the
// API server's to say.
func (l Limits) Validate() error {
	for _, q := range []struct{ name, v string }{{"cpu", l.CPU}, {"memory", l.Memory}} {
		if q.v == "" {
			continue
		}
		if len(q.v) > maxQuantityLength || !quantity.MatchString(q.v) {
			return fmt.Errorf("%s %.70q: want a quantity such as 4, 500m or 8Gi", q.name, q.v)
		}
	}
	if l.Pods < 0 {
		return fmt.Errorf("pods %d: want 0 (no limit) or more", l.Pods)
	}
	if l.Namespaces < 0 {
		return fmt.Errorf("namespaces %d: want 0 (no limit) or more", l.Namespaces)
	}
	return nil
}

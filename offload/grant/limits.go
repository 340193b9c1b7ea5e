// Package grant is what a provider sends a consumer when it lets it
// offload: a short-lived credential for the provider's API server with
// the limits it comes with, signed by the provider and sealed to the
// consumer. It knows nothing of Kubernetes: the offload package issues
// and uses what it carries.
package grant

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
}

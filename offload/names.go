// Package offload holds the Kubernetes side of offloading: on a provider,
// the tenants it creates for the consumers it grants and the credentials
// it issues them; on a consumer, the credentials it holds.
package offload

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

// Package tenancy is the provider's side of a grant: for each consumer it
// grants (by its Peer's spec or the policy) a tenant namespace with its
// ServiceAccount, RBAC, quota and limits (Tenants), a short-lived token
// issued, sealed and sent over the peering, renewed and revoked (Grants),
// the address consumers reach this API server at (APIServer), and the
// namespaces mirrored for a consumer, which only this package creates and
// deletes.
package tenancy

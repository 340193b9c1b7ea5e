// Package remote is the consumer's side of a grant: the credentials
// providers granted this cluster, opened, verified, kept in the ledger and
// shown on each Peer (Consumer); the REST config that reaches a provider
// with the credential held at each request; and the watches of the
// namespaces mirrored for this cluster on each provider, which pod
// offloading and reflection share (NamespaceWatches).
package remote

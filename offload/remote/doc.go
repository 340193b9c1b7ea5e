// Package remote is the consumer's side of a grant.
//
// The credentials providers granted this cluster: opened, verified, kept
// in the ledger and shown on each Peer (Consumer), and handed out only
// once this cluster's admin accepted the provider (Credentials).
//
// The one session with each provider (Sessions, Session), which
// namespace mirroring, pod offloading and reflection share instead of
// building their own. A session owns:
//   - one transport to the provider's API server, made from the granted
//     credential's server and CA, with no client-side rate limit;
//   - the token of the credential held at each request, so a renewed
//     token keeps the session and every watch over it; a credential that
//     reaches another server, CA or tenant namespace opens a new session,
//     and the features restart their watches over it;
//   - the clients over that transport, for writes (with the credential's
//     timeout) and for lists and watches (without), of the kinds the
//     features use there: NamespaceRequests, pods, ConfigMaps, Secrets,
//     Services and EndpointSlices (a static scheme and mapper, no
//     discovery), and the caches the features start over it.
//
// What a feature watches over a session stays the feature's: mirroring
// its NamespaceRequests in the tenant namespace, pods and reflection each
// their own kinds in the namespaces mirrored for this cluster, which
// NamespaceWatches keeps in line with the NamespaceOffloads; whether the
// provider answers is tracked the same way by each (Answering).
package remote

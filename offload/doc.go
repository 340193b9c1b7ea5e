// Package offload is the shared root of offloading: what every feature
// package below it names the same way. It holds the labels, annotations
// and names the agent writes (names.go), how a local namespace is named
// on a provider (remotename.go), the conditions and errors a reconcile
// reports (conditions.go, errors.go), the Peer status of a grant
// (status.go), the scheme and mapper of the kinds the features read, the
// views that translate a provider's addresses (views.go), and the
// informers of this cluster several features share (shared_cache.go,
// peers_cache.go).
//
// The features are packages of their own over this root and, on the
// consumer's side, remote's session; they never import one another
// (except mirror, which asks tenancy for the namespaces it makes, and
// mcsdns, which answers from mcs's names):
//
//   - tenancy: on a provider, the tenant of each consumer it grants, the
//     credentials it issues and renews, and the namespaces mirrored for it;
//   - remote: on a consumer, the credentials providers granted and the
//     client and watches that reach each provider with them;
//   - mirror: namespace offloading, both sides (NamespaceOffload on the
//     consumer, NamespaceRequest on the provider);
//   - vnode: a virtual node and its Lease per granted provider;
//   - kubeletapi: the kubelet API of the virtual nodes (logs, exec,
//     attach, port-forward), forwarded to the providers;
//   - placement: the admission webhook that applies a NamespaceOffload's
//     pod strategy;
//   - podsync: pods bound to a virtual node, run on their provider;
//   - reflection: the ConfigMaps, Secrets, Services and EndpointSlices
//     offloaded pods need, and the endpoints consumers reflect of third
//     clusters;
//   - mcs and mcsdns: the Multi-Cluster Services API and its DNS;
//   - grant: the sealed grant message, free of Kubernetes.
package offload

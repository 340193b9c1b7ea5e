package offload

import "net/netip"

// Views says how this cluster and a provider address each other's pods:
// the views the peering negotiated (ipam). The agent implements it over
// its ledger.
type Views interface {
	// Translate returns addr, an address in provider's own terms, as this
	// cluster reaches it; false when no view of provider covers addr.
	Translate(provider string, addr netip.Addr) (netip.Addr, bool)
	// ToRemote is Translate's inverse: addr, in this cluster's view of
	// provider, as provider itself uses it.
	ToRemote(provider string, addr netip.Addr) (netip.Addr, bool)
	// AsSeenBy returns addr, an address of this cluster's own (a local
	// pod's), as provider reaches it; false when provider has no view of
	// it.
	AsSeenBy(provider string, addr netip.Addr) (netip.Addr, bool)
}

package offload

import "net/netip"

// Views says how this cluster addresses a provider's pods: the views the
// peering negotiated (ipam). The agent implements it over its ledger.
type Views interface {
	// Translate returns addr, an address in provider's own terms, as this
	// cluster reaches it; false when no view of provider covers addr.
	Translate(provider string, addr netip.Addr) (netip.Addr, bool)
}

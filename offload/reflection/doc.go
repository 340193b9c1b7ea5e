// Package reflection copies what offloaded pods need into the namespaces
// mirrored for them on each provider: the ConfigMaps and Secrets they
// reference, the Services of their namespace and the EndpointSlices
// translated into the provider's view of this cluster (Reflector). On the
// provider's side, HostedEndpoints translates the endpoints a consumer
// reflected of third clusters into this cluster's own views of them.
package reflection

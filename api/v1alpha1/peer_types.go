package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Networking is the admin's decision on network peering with a cluster.
// +kubebuilder:validation:Enum="";Accept;Deny
type Networking string

const (
	// NetworkingDefault follows the agent's --peering policy: auto accepts,
	// manual waits for Accept.
	NetworkingDefault Networking = ""
	NetworkingAccept  Networking = "Accept"
	NetworkingDeny    Networking = "Deny"
)

// PeerSpec is what the admin decides about a peer.
type PeerSpec struct {
	// Networking: empty follows the agent's policy; Accept connects (needed
	// under --peering=manual); Deny tears the tunnel down on both sides.
	// +optional
	Networking Networking `json:"networking,omitempty"`
	// Offloading: whether the peer may offload to this cluster (this
	// cluster is then its provider). Empty follows the agent's
	// --offload-grants policy (manual by default: never without Grant);
	// Grant gives the peer a tenant namespace and a short-lived credential
	// for this cluster's API server; Deny revokes it.
	// +optional
	Offloading Offloading `json:"offloading,omitempty"`
	// OffloadTo: whether this cluster offloads to the peer (the peer is
	// then its provider) once the peer granted it. Empty follows the
	// agent's --offload-to policy (manual by default: never without
	// Accept); Accept uses the peer's grant; Deny leaves it unused, and
	// what was offloaded there is withdrawn.
	// +optional
	OffloadTo OffloadTo `json:"offloadTo,omitempty"`
	// OffloadLimits bound what the peer may run here when granted; a limit
	// left out is no limit of that kind.
	// +optional
	OffloadLimits *OffloadLimits `json:"offloadLimits,omitempty"`
	// Traffic: what traffic from the peer may reach in this cluster.
	// Empty follows the agent's --traffic (Full by default); Full lets it
	// reach every pod, as routed; Segregated only its pods offloaded here
	// and the endpoints of Services reflected or exported to it, on their
	// ports, enforced at the gateway (docs/policy.md).
	// +optional
	Traffic Traffic `json:"traffic,omitempty"`
}

// Traffic is how much of this cluster a peer's traffic reaches.
// +kubebuilder:validation:Enum="";Full;Segregated
type Traffic string

const (
	// TrafficDefault follows the agent's --traffic.
	TrafficDefault    Traffic = ""
	TrafficFull       Traffic = "Full"
	TrafficSegregated Traffic = "Segregated"
)

// OffloadTo is the admin's decision on offloading to a peer that granted
// this cluster.
// +kubebuilder:validation:Enum="";Accept;Deny
type OffloadTo string

const (
	// OffloadToDefault follows the agent's --offload-to policy.
	OffloadToDefault OffloadTo = ""
	OffloadToAccept  OffloadTo = "Accept"
	OffloadToDeny    OffloadTo = "Deny"
)

// Offloading is the admin's decision on letting a peer offload here.
// +kubebuilder:validation:Enum="";Grant;Deny
type Offloading string

const (
	// OffloadingDefault follows the agent's --offload-grants policy.
	OffloadingDefault Offloading = ""
	OffloadingGrant   Offloading = "Grant"
	OffloadingDeny    Offloading = "Deny"
)

// OffloadLimits bound what a consumer may run on its provider.
// +kubebuilder:validation:XValidation:rule="!has(self.cpu) || !quantity(string(self.cpu)).isLessThan(quantity('0'))",message="cpu must not be negative"
// +kubebuilder:validation:XValidation:rule="!has(self.memory) || !quantity(string(self.memory)).isLessThan(quantity('0'))",message="memory must not be negative"
type OffloadLimits struct {
	// CPU is the sum of the CPU requests of the consumer's pods.
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`
	// Memory is the sum of their memory requests.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Pods is how many pods the consumer may have at once.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Pods *int64 `json:"pods,omitempty"`
	// Namespaces is how many namespaces the consumer may have mirrored;
	// left out or 0, the provider's default (50).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Namespaces *int64 `json:"namespaces,omitempty"`
	// NamespaceNames says how the consumer may name the namespaces
	// mirrored for it: Suffixed (the default) only with the suffix of its
	// cluster ID (namespaceMapping DefaultName), so that it cannot take a
	// name this cluster's own workloads may want (monitoring, argocd);
	// Any also under its own names (SameName, Selected). Reserved names
	// (default, kube-*, flotilla-*, openshift-*) are refused either way.
	// +optional
	NamespaceNames NamespaceNames `json:"namespaceNames,omitempty"`

	// Object counts in each of the consumer's namespaces here (its tenant
	// namespace and each one mirrored for it); left out or 0, the
	// provider's default. They are always set: a consumer cannot fill
	// this cluster's etcd.

	// Services per namespace (default 100).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Services *int64 `json:"services,omitempty"`
	// Secrets per namespace (default 200).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Secrets *int64 `json:"secrets,omitempty"`
	// ConfigMaps per namespace (default 200).
	// +kubebuilder:validation:Minimum=0
	// +optional
	ConfigMaps *int64 `json:"configMaps,omitempty"`
	// EndpointSlices per namespace (default 500), those Kubernetes makes
	// for the consumer's Services included.
	// +kubebuilder:validation:Minimum=0
	// +optional
	EndpointSlices *int64 `json:"endpointSlices,omitempty"`
	// PersistentVolumeClaims per namespace (default 20).
	// +kubebuilder:validation:Minimum=0
	// +optional
	PersistentVolumeClaims *int64 `json:"persistentVolumeClaims,omitempty"`
	// EphemeralStorage is the sum of the ephemeral-storage requests of
	// the pods in each namespace (default 50Gi).
	// +optional
	EphemeralStorage *resource.Quantity `json:"ephemeralStorage,omitempty"`
}

// NamespaceNames is how a consumer may name its namespaces on a provider.
// +kubebuilder:validation:Enum="";Suffixed;Any
type NamespaceNames string

const (
	// NamespaceNamesSuffixed: only names that end in "-" and the suffix
	// of the consumer's cluster ID (the default).
	NamespaceNamesSuffixed NamespaceNames = "Suffixed"
	// NamespaceNamesAny: any name that is not reserved.
	NamespaceNamesAny NamespaceNames = "Any"
)

// Phase is where a peering stands.
// +kubebuilder:validation:Enum=Discovered;Negotiating;Connected;Degraded;Unreachable;Denied
type Phase string

const (
	// PhaseDiscovered: the cluster is a member; nothing exchanged yet, or
	// waiting for acceptance.
	PhaseDiscovered Phase = "Discovered"
	// PhaseNegotiating: statements exchanged, views not yet agreed or the
	// tunnel not yet up.
	PhaseNegotiating Phase = "Negotiating"
	// PhaseConnected: views agreed both ways and the tunnel has a recent
	// handshake.
	PhaseConnected Phase = "Connected"
	// PhaseDegraded: configured, but no recent handshake.
	PhaseDegraded Phase = "Degraded"
	// PhaseUnreachable: the member failed; its tunnel is removed after the
	// grace period.
	PhaseUnreachable Phase = "Unreachable"
	// PhaseDenied: this side or the other denies networking.
	PhaseDenied Phase = "Denied"
)

// NetworkView says how one side addresses a range of the other.
type NetworkView struct {
	// Range is the real range, in its owner's address space.
	Range string `json:"range"`
	// As is how the viewing side addresses it; equal to Range when nothing
	// overlaps.
	As string `json:"as"`
}

// PeerStatus is what the agent observes and negotiated.
type PeerStatus struct {
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// ClusterName is the peer's human name (its --cluster-name).
	// +optional
	ClusterName string `json:"clusterName,omitempty"`
	// AnnouncedLabels are the labels the peer announces about itself
	// (its --cluster-label). They select nothing: a NamespaceOffload's
	// clusterSelector reads the Peer's own labels, which only this
	// cluster's admin sets (kubectl label peer), copying an announced one
	// when they trust it.
	// +optional
	AnnouncedLabels map[string]string `json:"announcedLabels,omitempty"`
	// Sources are the discovery sources that found the peer (mdns, dns,
	// seed, gossip).
	// +optional
	Sources []string `json:"sources,omitempty"`
	// Gossip is the peer's gossip address.
	// +optional
	Gossip string `json:"gossip,omitempty"`
	// Endpoint is the peer's WireGuard endpoint in use.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// PublicKey is the peer's WireGuard public key.
	// +optional
	PublicKey string `json:"publicKey,omitempty"`
	// TheirNetworks: the peer's ranges and how this cluster sees them.
	// +optional
	TheirNetworks []NetworkView `json:"theirNetworks,omitempty"`
	// MyNetworks: this cluster's ranges and how the peer sees them.
	// +optional
	MyNetworks []NetworkView `json:"myNetworks,omitempty"`
	// Views summarises TheirNetworks for kubectl: "range=>as,...".
	// +optional
	Views string `json:"views,omitempty"`
	// LastHandshake is the last WireGuard handshake with the peer. Traffic
	// counters are metrics (flotilla_peer_receive_bytes_total and
	// flotilla_peer_transmit_bytes_total), not status.
	// +optional
	LastHandshake *metav1.Time `json:"lastHandshake,omitempty"`
	// StatementGeneration is the generation of the peer's last accepted
	// signed statement.
	// +optional
	StatementGeneration int64 `json:"statementGeneration,omitempty"`
	// ObservedGeneration is the generation of the spec the agent acted on
	// when it wrote this status.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Offloading is what each side grants the other for offloading; it
	// never holds a credential.
	// +optional
	Offloading *OffloadingStatus `json:"offloading,omitempty"`
	// Traffic is the mode in effect for traffic from the peer:
	// spec.traffic, else the agent's --traffic. Written once the agent has
	// read what a Segregated peer may reach (docs/policy.md).
	// +optional
	Traffic Traffic `json:"traffic,omitempty"`
	// Allowed is, while the peer is Segregated, the size of what it may
	// reach as applied at the gateway.
	// +optional
	Allowed *TrafficAllowed `json:"allowed,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TrafficAllowed is the size of a Segregated peer's sets at the gateway.
type TrafficAllowed struct {
	// Pods are the addresses of the peer's pods offloaded here.
	Pods int64 `json:"pods"`
	// Services are the endpoints of the Services reflected or exported to
	// the peer: address, protocol and port, one for each.
	Services int64 `json:"services"`
}

// OffloadingStatus says what this cluster grants the peer and what the
// peer grants this cluster.
type OffloadingStatus struct {
	// Granted: this cluster is the peer's provider.
	// +optional
	Granted *GrantStatus `json:"granted,omitempty"`
	// Received: the peer is this cluster's provider.
	// +optional
	Received *GrantStatus `json:"received,omitempty"`
}

// GrantStatus describes one grant, on either side.
type GrantStatus struct {
	// Namespace is the consumer's tenant namespace on the provider.
	Namespace string `json:"namespace"`
	// Server is the provider's API server URL the credential is for.
	// +optional
	Server string `json:"server,omitempty"`
	// Limits are the grant's limits.
	// +optional
	Limits *OffloadLimits `json:"limits,omitempty"`
	// Expires is when the credential in use expires; it is renewed
	// before then.
	// +optional
	Expires *metav1.Time `json:"expires,omitempty"`
}

// Condition types of a Peer.
const (
	// ConditionMember: the cluster is an alive member of the federation.
	ConditionMember = "Member"
	// ConditionAccepted: both sides accept networking.
	ConditionAccepted = "Accepted"
	// ConditionViewsAgreed: both sides know how each sees the other.
	ConditionViewsAgreed = "ViewsAgreed"
	// ConditionTunnelUp: the tunnel to the peer has a recent handshake.
	ConditionTunnelUp = "TunnelUp"
	// ConditionReachable: one of the two gateways can be reached first
	// (False, BothBehindNAT: both are behind NAT and cannot peer).
	ConditionReachable = "Reachable"
	// ConditionOffloadGranted: this cluster lets the peer offload here
	// (it is the peer's provider), and the peer holds a credential.
	ConditionOffloadGranted = "OffloadGranted"
	// ConditionOffloadCredential: the peer lets this cluster offload there,
	// and this cluster holds a valid credential for its API server.
	ConditionOffloadCredential = "OffloadCredential"
)

// ReasonFencesNotEnforced is the OffloadGranted condition's reason while
// the grant gives the peer nothing because this cluster's admission
// fences are not proven enforced; the agent proves them again within
// seconds, so a client may wait it out.
const ReasonFencesNotEnforced = "FencesNotEnforced"

// Peer is another cluster of the federation, as this cluster sees it. The
// agent creates one per discovered cluster, named after its cluster ID.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=peer
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.status.clusterName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`
// +kubebuilder:printcolumn:name="Handshake",type=date,JSONPath=`.status.lastHandshake`,description="Time since the last WireGuard handshake"
// +kubebuilder:printcolumn:name="Views",type=string,JSONPath=`.status.views`,priority=1
// +kubebuilder:printcolumn:name="Networking",type=string,JSONPath=`.spec.networking`,priority=1
// +kubebuilder:printcolumn:name="Sources",type=string,JSONPath=`.status.sources`,priority=1
// +kubebuilder:printcolumn:name="Offloading",type=string,JSONPath=`.spec.offloading`,priority=1
// +kubebuilder:printcolumn:name="Traffic",type=string,JSONPath=`.status.traffic`,priority=1,description="Full or Segregated, as in effect: spec.traffic, else the agent's --traffic"
// +kubebuilder:printcolumn:name="Hosting",type=string,JSONPath=`.status.conditions[?(@.type=="OffloadGranted")].reason`,description="Whether the peer may offload here (this cluster hosts it)"
// +kubebuilder:printcolumn:name="Offload",type=string,JSONPath=`.status.conditions[?(@.type=="OffloadCredential")].reason`,description="Whether this cluster may offload to the peer (holds its credential)"
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.offloading.received.expires`,priority=1,description="When the credential the peer granted expires (renewed before)"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Peer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PeerSpec   `json:"spec,omitempty"`
	Status PeerStatus `json:"status,omitempty"`
}

// PeerList is a list of Peers.
//
// +kubebuilder:object:root=true
type PeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Peer `json:"items"`
}

// Labels the agent sets on Peers.
const (
	// LabelClusterName carries the peer's human name.
	LabelClusterName = "flotilla.io/cluster-name"
	// LabelManagedBy marks objects the agent owns.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is LabelManagedBy's value.
	ManagedByValue = "flotilla"
)

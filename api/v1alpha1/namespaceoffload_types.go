package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NamespaceMapping says how an offloaded namespace is named on a provider.
// +kubebuilder:validation:Enum=DefaultName;SameName;Selected
type NamespaceMapping string

const (
	// MappingDefaultName: the local name plus a short suffix of the
	// consumer's cluster ID, hashed when the result would be too long.
	MappingDefaultName NamespaceMapping = "DefaultName"
	// MappingSameName: the local name.
	MappingSameName NamespaceMapping = "SameName"
	// MappingSelected: spec.remoteName.
	MappingSelected NamespaceMapping = "Selected"
)

// PodOffloading says where the pods of an offloaded namespace may run.
// +kubebuilder:validation:Enum=LocalAndRemote;Remote;Local
type PodOffloading string

const (
	PodsLocalAndRemote PodOffloading = "LocalAndRemote"
	PodsRemote         PodOffloading = "Remote"
	PodsLocal          PodOffloading = "Local"
)

// NamespaceOffloadSpec is what the user wants of the namespace it is in.
// +kubebuilder:validation:XValidation:rule="self.namespaceMapping != 'Selected' || (has(self.remoteName) && size(self.remoteName) > 0)",message="namespaceMapping Selected needs remoteName"
type NamespaceOffloadSpec struct {
	// ClusterSelector picks the Peers (by their labels: the provider's
	// cluster labels and the local admin's) the namespace extends to;
	// empty: every peer that granted this cluster offloading.
	// At most 32 matchLabels and 16 matchExpressions of at most 64
	// values each: a selector is a short rule, not a list of clusters.
	// +kubebuilder:validation:XValidation:rule="!has(self.matchLabels) || size(self.matchLabels) <= 32",message="clusterSelector: at most 32 matchLabels"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || size(self.matchExpressions) <= 16",message="clusterSelector: at most 16 matchExpressions"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, !has(e.values) || size(e.values) <= 64)",message="clusterSelector: at most 64 values per matchExpression"
	// +optional
	ClusterSelector *metav1.LabelSelector `json:"clusterSelector,omitempty"`
	// NamespaceMapping names the namespace on each provider (default
	// DefaultName).
	// +kubebuilder:default=DefaultName
	// +optional
	NamespaceMapping NamespaceMapping `json:"namespaceMapping,omitempty"`
	// RemoteName is the name on every provider with Selected: a DNS
	// label (lower case letters, digits and '-', at most 63).
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="remoteName must be a DNS label: lower case letters, digits and '-', starting and ending with a letter or digit"
	// +optional
	RemoteName string `json:"remoteName,omitempty"`
	// PodOffloading says where the namespace's pods may run (default
	// LocalAndRemote).
	// +kubebuilder:default=LocalAndRemote
	// +optional
	PodOffloading PodOffloading `json:"podOffloading,omitempty"`
}

// OffloadPhase sums up a NamespaceOffload.
// +kubebuilder:validation:Enum=Ready;NoClusterSelected;InProgress;SomeFailed;AllFailed;Terminating
type OffloadPhase string

const (
	OffloadReady             OffloadPhase = "Ready"
	OffloadNoClusterSelected OffloadPhase = "NoClusterSelected"
	OffloadInProgress        OffloadPhase = "InProgress"
	OffloadSomeFailed        OffloadPhase = "SomeFailed"
	OffloadAllFailed         OffloadPhase = "AllFailed"
	OffloadTerminating       OffloadPhase = "Terminating"
)

// ClusterOffload is where a namespace stands on one selected provider.
type ClusterOffload struct {
	// ClusterID is the provider's (its Peer's name).
	ClusterID string `json:"clusterID"`
	// ClusterName is its human name.
	// +optional
	ClusterName string `json:"clusterName,omitempty"`
	// RemoteNamespace is the namespace's name there.
	// +optional
	RemoteNamespace string `json:"remoteNamespace,omitempty"`
	// Conditions: Ready (the namespace exists there, with this cluster's
	// rights), with a reason a user can act on.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Conditions of a ClusterOffload besides Ready, each written by its own
// controller with its own field manager.
const (
	// ConditionReflected says whether what the namespace's offloaded pods
	// need (ConfigMaps, Secrets, Services, EndpointSlices) is reflected to
	// that provider (docs/services.md, "Reflection").
	ConditionReflected = "Reflected"
	// ReasonReflected: nothing stands in the way.
	ReasonReflected = "Reflected"
	// ReasonForeignObject: an object of a reflected one's name is there
	// and not ours; it is left alone, and the message names it.
	ReasonForeignObject = "ForeignObject"
	// ReasonForbidden: this cluster's agent may not read the namespace's
	// ConfigMaps and Secrets (no RoleBinding flotilla-reflection there);
	// the message says what to bind. What was reflected before stays.
	ReasonForbidden = "Forbidden"
)

// NamespaceOffloadStatus is what the agent did.
type NamespaceOffloadStatus struct {
	// +optional
	Phase OffloadPhase `json:"phase,omitempty"`
	// Clusters are the selected providers.
	// +optional
	// +listType=map
	// +listMapKey=clusterID
	Clusters []ClusterOffload `json:"clusters,omitempty"`
	// ObservedGeneration is the spec this status acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions of the namespace as a whole: Placement (whether new pods
	// of the namespace reach the placement webhook).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// The condition of a NamespaceOffload as a whole.
const (
	// ConditionPlacement says whether the namespace carries
	// flotilla.io/offloaded=true, the label that sends its new pods to the
	// placement webhook. Only an administrator sets it (`flotilla offload
	// namespace` does); the agent may not, so it reports it missing.
	ConditionPlacement = "Placement"
	// ReasonLabelled: the label is there; new pods are placed.
	ReasonLabelled = "Labelled"
	// ReasonNotLabelled: the label is missing; new pods stay in this
	// cluster, and the message says how to set it.
	ReasonNotLabelled = "NotLabelled"
)

// NamespaceOffload extends the namespace it is in to the providers its
// selector picks: the namespace is mirrored there, through each
// provider's agent. One per namespace, named "offload".
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=nsoffload
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Mapping",type=string,JSONPath=`.spec.namespaceMapping`
// +kubebuilder:printcolumn:name="Pods",type=string,JSONPath=`.spec.podOffloading`
// +kubebuilder:printcolumn:name="Clusters",type=string,JSONPath=`.status.clusters[*].clusterName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NamespaceOffload struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NamespaceOffloadSpec   `json:"spec,omitempty"`
	Status NamespaceOffloadStatus `json:"status,omitempty"`
}

// NamespaceOffloadList is a list of NamespaceOffloads.
//
// +kubebuilder:object:root=true
type NamespaceOffloadList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NamespaceOffload `json:"items"`
}

// NamespaceRequestSpec is what a consumer asks its provider for.
type NamespaceRequestSpec struct {
	// SourceNamespace is the consumer's namespace being offloaded.
	// +kubebuilder:validation:MaxLength=63
	SourceNamespace string `json:"sourceNamespace"`
}

// RequestPhase is where a NamespaceRequest stands.
// +kubebuilder:validation:Enum=Pending;Created;Refused
type RequestPhase string

const (
	RequestPending RequestPhase = "Pending"
	RequestCreated RequestPhase = "Created"
	RequestRefused RequestPhase = "Refused"
)

// NamespaceRequestStatus is the provider's answer.
type NamespaceRequestStatus struct {
	// +optional
	Phase RequestPhase `json:"phase,omitempty"`
	// Reason is CamelCase (Created, AlreadyExists, Reserved, InvalidName,
	// OverLimit, NotGranted); Message says it to a person.
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// NamespaceRequest is a consumer's request, written in its tenant
// namespace on the provider, for a namespace named like the request. The
// provider's agent validates it, creates the namespace with the
// consumer's rights and answers in status; the consumer never creates
// namespaces itself.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceNamespace`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NamespaceRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NamespaceRequestSpec   `json:"spec,omitempty"`
	Status NamespaceRequestStatus `json:"status,omitempty"`
}

// NamespaceRequestList is a list of NamespaceRequests.
//
// +kubebuilder:object:root=true
type NamespaceRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NamespaceRequest `json:"items"`
}

// Labels and finalizers of namespace offloading.
const (
	// LabelMirroredFrom marks a provider's namespace mirrored for a
	// consumer; its value is the consumer's namespace.
	LabelMirroredFrom = "flotilla.io/mirrored-from"
	// LabelVirtualNode is "true" on the Nodes that stand for providers
	// (the virtual nodes): what the agent and the fabric leave out of the
	// cluster's own nodes.
	LabelVirtualNode = "flotilla.io/virtual-node"
	// FinalizerOffload holds a NamespaceOffload until its remote
	// namespaces are gone; FinalizerRequest holds a NamespaceRequest until
	// its namespace is.
	FinalizerOffload = "flotilla.io/offload"
	FinalizerRequest = "flotilla.io/namespace"
)

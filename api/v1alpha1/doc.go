// Package v1alpha1 holds the flotilla.io/v1alpha1 API: the Peer, one per
// cluster of the federation this cluster has discovered.
//
// +kubebuilder:object:generate=true
// +groupName=flotilla.io
package v1alpha1

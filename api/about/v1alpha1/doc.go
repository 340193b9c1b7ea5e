// Package v1alpha1 holds KEP-2149's about.k8s.io/v1alpha1 API: the
// ClusterProperty, by which a cluster says its ID and its clusterset's
// name. No module of the KEP's is published for our Kubernetes version,
// so the type is defined here, its schema the KEP's.
//
// +kubebuilder:object:generate=true
// +groupName=about.k8s.io
package v1alpha1

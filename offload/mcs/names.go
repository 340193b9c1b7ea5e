// Package mcs is the Multi-Cluster Services API (sigs.k8s.io/mcs-api,
// KEP-1645) across the federation: a ServiceExport in one cluster becomes
// a ServiceImport, a derived Service and EndpointSlices in every cluster
// that has the namespace, its addresses translated into each importer's
// views; and the cluster's identity per KEP-2149 (ClusterProperty).
package mcs

import mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

// How the objects an importer writes are known (docs/services.md).
const (
	// LabelServiceName and LabelSourceCluster are the KEP's labels on
	// every imported EndpointSlice: the exported Service's name, and the
	// cluster ID of the cluster it came from.
	LabelServiceName   = mcsv1alpha1.LabelServiceName
	LabelSourceCluster = mcsv1alpha1.LabelSourceCluster
	// ManagedBy is the endpointslice.kubernetes.io/managed-by value of
	// every EndpointSlice an importer writes: the EndpointSlice
	// controller leaves them alone, and the agent touches no other.
	ManagedBy = "mcs.flotilla.io"
	// DerivedServicePrefix starts the name of the Service an importer
	// derives for a ClusterSetIP ServiceImport (its ClusterIP is the
	// ClusterSetIP, and kube-proxy serves it from the imported slices).
	DerivedServicePrefix = "flotilla-mcs-"
	// ClusterIDProperty and ClusterSetProperty are KEP-2149's
	// ClusterProperty names: this cluster's ID (Flotilla's cluster ID)
	// and the clusterset's (the federation's).
	ClusterIDProperty  = "cluster.clusterset.k8s.io"
	ClusterSetProperty = "clusterset.k8s.io"
	// Zone is the DNS zone the agent answers for the clusterset.
	Zone = "clusterset.local."
)

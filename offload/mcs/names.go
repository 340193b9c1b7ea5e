// Package mcs is the Multi-Cluster Services API (sigs.k8s.io/mcs-api,
// KEP-1645) across the federation: a ServiceExport in one cluster becomes
// a ServiceImport, a derived Service and EndpointSlices in every cluster
// that has the namespace, its addresses translated into each importer's
// views; and the cluster's identity per KEP-2149 (ClusterProperty).
package mcs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
)

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
	// ClusterProperty names, as the about API defines them.
	ClusterIDProperty  = aboutv1alpha1.ClusterIDProperty
	ClusterSetProperty = aboutv1alpha1.ClusterSetProperty
	// Zone is the DNS zone the agent answers for the clusterset.
	Zone = "clusterset.local."
)

// What the importer writes, beyond the KEP's labels.
const (
	// LabelManagedBy with the value ManagedBy marks the ServiceImports and
	// derived Services an importer writes: one without it is foreign and
	// never touched.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ImportConditionValid and ImportConditionConflict are the KEP's
	// ServiceImport conditions that v0.5.2 of the API does not name (it
	// names Ready only).
	ImportConditionValid    = "Valid"
	ImportConditionConflict = "Conflict"
)

// DerivedServiceName is the name of the Service an importer derives for
// the ServiceImport service: the prefix and the name, cut with a hash of
// the name when that passes 63 characters (a Service name is a DNS-1035
// label).
func DerivedServiceName(service string) string {
	name := DerivedServicePrefix + service
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(service))
	return name[:63-9] + "-" + hex.EncodeToString(sum[:4])
}

// ImportedSliceName is the name of the index-th EndpointSlice an importer
// writes for service's endpoints in cluster: one truth, so that a
// restarted importer finds the slices it wrote before.
func ImportedSliceName(service, cluster string, index int) string {
	sum := sha256.Sum256([]byte(cluster))
	return fmt.Sprintf("%s-%s-%d", DerivedServiceName(service), hex.EncodeToString(sum[:4]), index)
}

// AddressLabel is an address as a DNS label, dashed as CoreDNS names
// endpoints: 10-1-0-7, fd00--7.
func AddressLabel(a netip.Addr) string {
	return strings.NewReplacer(".", "-", ":", "-").Replace(a.String())
}

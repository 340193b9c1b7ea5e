// Package mirror is namespace offloading, both sides. On the consumer,
// Consumer follows NamespaceOffloads and writes a NamespaceRequest per
// namespace into its tenant namespace on each selected provider; on the
// provider, Provider answers the requests of the consumers it grants and
// has tenancy create or delete the mirrored namespaces. A consumer never
// holds the right to create namespaces on its provider.
package mirror

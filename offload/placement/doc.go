// Package placement is the admission webhook that applies a
// NamespaceOffload's pod strategy to the pods created in its namespace
// (tolerations of the virtual nodes, and node affinity to them, to local
// nodes or to both), and keeps its MutatingWebhookConfiguration and
// serving certificate.
package placement

// Package vnode keeps a virtual Node per provider that granted this
// cluster offloading, with its Lease, capacity from the grant's limits and
// Ready while the peer is connected and the credential works; it deletes
// the node (and the pods bound to it, for their controllers to make them
// again) when the grant ends.
package vnode

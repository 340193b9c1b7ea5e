// Package podsync runs the pods bound to a virtual node on their
// provider: each is created in the namespace mirrored there, its status
// comes back with its addresses translated into this cluster's view of
// the provider, and it is deleted on both sides together.
package podsync

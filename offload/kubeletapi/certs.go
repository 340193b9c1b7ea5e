package kubeletapi

import (
	"time"

	"github.com/flotilla-io/flotilla/offload/internal/certs"
)

// The kubelet API's certificates come from a certs.CAStore, as the
// placement webhook's do, with their own CAs in their own Secret: an API
// server that verifies kubelets (--kubelet-certificate-authority) trusts
// these, and nothing else needs to.
const (
	// CASecret holds the kubelet API's CAs, in the agent's
	// namespace; its ca.crt is what such an API server must trust.
	CASecret = "flotilla-kubelet-ca"
	// DefaultCALifetime is a CA's; a successor is made when a
	// third of it is left, as for the webhook.
	DefaultCALifetime = 365 * 24 * time.Hour
	// DefaultServingLifetime is the serving certificate's; it is
	// renewed at two thirds of it, and when the virtual nodes change.
	DefaultServingLifetime = 7 * 24 * time.Hour
)

// Lifetimes are the kubelet API's lifetimes, the defaults where
// the config sets none. An API server reads --kubelet-certificate-authority
// once, at start, and an operator copies the bundle there, so a new CA
// signs as late as it can: when the old one can no longer cover a whole
// serving certificate. The operator has the months in between.
func Lifetimes(cfg Config) certs.CertLifetimes {
	l := certs.CertLifetimes{CA: DefaultCALifetime, Serving: DefaultServingLifetime}
	if cfg.CALifetime > 0 {
		l.CA = cfg.CALifetime
	}
	if cfg.ServingLifetime > 0 {
		l.Serving = cfg.ServingLifetime
	}
	l.Publish = l.CA/3 - l.Serving
	if cfg.CAPublishDelay > 0 {
		l.Publish = cfg.CAPublishDelay
	}
	return l
}

// kubeletHosts is what the serving certificate names: the address the
// virtual nodes register as their InternalIP, which is the address the
// API server dials and verifies (a certificate for any other address
// fails there), and the virtual nodes' names.
func kubeletHosts(k *Server) []string {
	return append([]string{k.cfg.Address.String()}, k.virtualNodeNames()...)
}

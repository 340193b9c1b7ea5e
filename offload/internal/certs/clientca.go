package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// Where a cluster publishes the authority its API server's client
// certificates chain to (kube-apiserver --client-ca-file): the ConfigMap
// every extension API server and kubelet-like server reads (the Role
// extension-apiserver-authentication-reader grants it). The API server
// keeps it current.
const (
	ClusterClientCANamespace = "kube-system"
	ClusterClientCAConfigMap = "extension-apiserver-authentication"
	ClusterClientCAKey       = "client-ca-file"
)

// ErrNoClientCertificate: the caller sent no client certificate.
var ErrNoClientCertificate = errors.New("no client certificate")

// ClientCA verifies client certificates against a CA bundle: a fixed one
// (NewClientCA), or the cluster's client CA as its ConfigMap last said it
// (SetFrom).
type ClientCA struct {
	// Name says whose CA it is in log lines ("kubelet API").
	Name string
	Log  *slog.Logger

	mu   sync.Mutex
	pool *x509.CertPool
	last string // what was last logged: the bundle, or why it was not taken
}

// NewClientCA is a ClientCA of the PEM bundle pemCerts.
func NewClientCA(name string, pemCerts []byte) (*ClientCA, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCerts) {
		return nil, fmt.Errorf("%s: the client CA bundle holds no PEM certificate", name)
	}
	return &ClientCA{Name: name, pool: pool}, nil
}

// SetFrom takes the bundle of the cluster's client CA ConfigMap cm; one
// without a usable bundle leaves the one held (the API server rewrites
// it soon), and says so once.
func (c *ClientCA) SetFrom(cm *corev1.ConfigMap) {
	bundle := cm.Data[ClusterClientCAKey]
	pool := x509.NewCertPool()
	var problem string
	switch {
	case bundle == "":
		problem = fmt.Sprintf("ConfigMap %s/%s has no %s", ClusterClientCANamespace, ClusterClientCAConfigMap, ClusterClientCAKey)
	case !pool.AppendCertsFromPEM([]byte(bundle)):
		problem = fmt.Sprintf("%s of ConfigMap %s/%s holds no PEM certificate", ClusterClientCAKey, ClusterClientCANamespace, ClusterClientCAConfigMap)
	}
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if problem != "" {
		if c.last != problem {
			c.last = problem
			log.Warn(c.Name+": the cluster's client CA not taken; keeping the one held", "problem", problem, "held", c.pool != nil)
		}
		return
	}
	c.pool = pool
	if c.last != bundle {
		c.last = bundle
		log.Info(c.Name+": the cluster's client CA taken", "configmap", ClusterClientCANamespace+"/"+ClusterClientCAConfigMap)
	}
}

// Verify returns the client certificate of a connection once it chains
// to the CA for client authentication; ErrNoClientCertificate when the
// client sent none.
func (c *ClientCA) Verify(state *tls.ConnectionState) (*x509.Certificate, error) {
	if state == nil || len(state.PeerCertificates) == 0 {
		return nil, ErrNoClientCertificate
	}
	c.mu.Lock()
	pool := c.pool
	c.mu.Unlock()
	if pool == nil {
		return nil, fmt.Errorf("the cluster's client CA is not known yet (ConfigMap %s/%s)", ClusterClientCANamespace, ClusterClientCAConfigMap)
	}
	leaf := state.PeerCertificates[0]
	opts := x509.VerifyOptions{
		Roots: pool, Intermediates: x509.NewCertPool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range state.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(opts); err != nil {
		return nil, fmt.Errorf("client certificate %q: %w", leaf.Subject.CommonName, err)
	}
	return leaf, nil
}

package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// CAStore keeps the CAs of one of the agent's servers in a Secret of the
// agent's namespace, rotates them, and issues the server's serving
// certificate from them. The placement webhook and the kubelet API each
// have one: what differs between them is how a CA reaches whoever must
// trust it (the webhook applies its caBundle itself; the kubelet API's
// is copied by an operator), which their owners say by noting when a CA
// was published.
//
// Sync, Load, SetHosts and the note methods are called from the owner's
// one goroutine; certificate, bundle, ready and the metrics from any.
type CAStore struct {
	kube      kubeclient.Interface
	namespace string
	secret    string
	// name is the server's, in its certificates' subjects and in errors.
	name      string
	lifetimes CertLifetimes
	log       *slog.Logger
	expiry    *prometheus.Desc

	cert atomic.Pointer[tls.Certificate]

	mu        sync.Mutex
	cas       CASet
	published map[string]time.Time // by CA id: since when it is trusted
	hosts     []string
	serving   *ServingCert
	reissue   bool // the hosts changed since serving was issued
}

// CAStoreConfig is what a CAStore needs; component labels its metrics.
type CAStoreConfig struct {
	Kube              kubeclient.Interface
	Namespace, Secret string
	Name, Component   string
	Lifetimes         CertLifetimes
	Log               *slog.Logger
}

func NewCAStore(c CAStoreConfig) *CAStore {
	return &CAStore{
		kube: c.Kube, namespace: c.Namespace, secret: c.Secret, name: c.Name, lifetimes: c.Lifetimes, log: c.Log,
		published: map[string]time.Time{},
		expiry: prometheus.NewDesc("flotilla_certificate_expiry_seconds",
			"Seconds until a certificate of the agent's servers expires: the serving certificate (cert=serving) and the CA that signed it (cert=ca), by server (placement_webhook, kubelet_api).",
			[]string{"cert"}, prometheus.Labels{"component": c.Component}),
	}
}

// Load reads the CAs from their Secret, so that a restarted agent keeps
// serving what the API server trusts. A Secret that does not read back
// (edited by hand) is logged and replaced by a new CA at the next Sync.
func (s *CAStore) Load(ctx context.Context) error {
	sec, err := s.kube.CoreV1().Secrets(s.namespace).Get(ctx, s.secret, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		s.log.Info("no CA yet; making one", "secret", s.namespace+"/"+s.secret)
		return nil
	case err != nil:
		return fmt.Errorf("%s: read Secret %s/%s: %w", s.name, s.namespace, s.secret, err)
	}
	cas, err := DecodeCAs(sec.Data)
	if err != nil {
		s.log.Warn("the CA Secret is unusable; making a new CA", "secret", s.namespace+"/"+s.secret, "err", err)
	}
	s.mu.Lock()
	s.cas = cas
	s.mu.Unlock()
	return nil
}

// NoteTrusted records that the CAs in bundle are trusted already (found
// there at start): each since it was made, as it cannot have been
// published earlier.
func (s *CAStore) NoteTrusted(bundle []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ca := range s.cas {
		if _, ok := s.published[ca.ID()]; !ok && bytes.Contains(bundle, ca.PEM()) {
			s.published[ca.ID()] = ca.Made()
		}
	}
}

// NotePublished records that every CA held has been published, at now
// for those not recorded yet.
func (s *CAStore) NotePublished(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ca := range s.cas {
		if _, ok := s.published[ca.ID()]; !ok {
			s.published[ca.ID()] = now
		}
	}
}

// SetHosts sets what the serving certificate names; true when that
// changed, and the next Sync issues a certificate for them.
func (s *CAStore) SetHosts(hosts []string) bool {
	hosts = slices.Clone(hosts)
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Equal(hosts, s.hosts) {
		return false
	}
	s.hosts = hosts
	s.reissue = true
	return true
}

// Sync rotates the CAs, saving them first (a CA the API server may come
// to trust is never lost), and renews the serving certificate when due
// or when a newer CA may sign it. It says whether the CAs changed: the
// owner publishes the new bundle.
func (s *CAStore) Sync(ctx context.Context, now time.Time) (bool, error) {
	s.mu.Lock()
	cas, hosts := s.cas, s.hosts
	s.mu.Unlock()
	rotated, changed, err := cas.Rotated(s.name, now, s.lifetimes.CA)
	if err != nil {
		return false, fmt.Errorf("%s: %w", s.name, err)
	}
	if changed {
		data, err := rotated.Encode()
		if err != nil {
			return false, fmt.Errorf("%s: %w", s.name, err)
		}
		if err := s.save(ctx, data); err != nil {
			return false, err
		}
		s.log.Info("CAs rotated", "secret", s.namespace+"/"+s.secret, "cas", describeCAs(rotated))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cas = rotated
	signer := s.cas.Signer(s.published, now, s.lifetimes.Publish)
	if c := s.serving; c != nil && !s.reissue && c.issuer == signer.ID() && now.Before(c.RenewAt) {
		return changed, nil
	}
	c, err := IssueServing(signer, s.name, hosts, now, s.lifetimes.Serving)
	if err != nil {
		return changed, fmt.Errorf("%s: %w", s.name, err)
	}
	s.serving, s.reissue = c, false
	s.cert.Store(c.TLS)
	s.log.Info("serving certificate issued", "ca", signer.ID(), "hosts", hosts, "notAfter", c.TLS.Leaf.NotAfter, "renewAt", c.RenewAt)
	return changed, nil
}

// save writes the CAs to the Secret, labelled as ours.
func (s *CAStore) save(ctx context.Context, data map[string][]byte) error {
	sec := corev1ac.Secret(s.secret, s.namespace).
		WithLabels(map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, "app.kubernetes.io/name": "flotilla"}).
		WithType(corev1.SecretTypeOpaque).
		WithData(data)
	if _, err := s.kube.CoreV1().Secrets(s.namespace).Apply(ctx, sec, metav1.ApplyOptions{FieldManager: caStoreFieldOwner, Force: true}); err != nil {
		return fmt.Errorf("%s: apply Secret %s/%s: %w", s.name, s.namespace, s.secret, err)
	}
	return nil
}

// caStoreFieldOwner applies the CA Secrets; the placement webhook's
// objects had it first.
const caStoreFieldOwner = "flotilla-placement"

// WakeAt is when Sync has something to do next: a CA to rotate or drop,
// the serving certificate to renew, a new CA published long enough to
// sign; now when there is no serving certificate.
func (s *CAStore) WakeAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving == nil || s.reissue {
		return time.Time{}
	}
	at := s.cas.RotateAt(s.lifetimes.CA)
	if s.serving.RenewAt.Before(at) {
		at = s.serving.RenewAt
	}
	if n := s.cas.Newest(); n != nil && s.serving.issuer != n.ID() {
		if p, ok := s.published[n.ID()]; ok && p.Add(s.lifetimes.Publish).Before(at) {
			at = p.Add(s.lifetimes.Publish)
		}
	}
	return at
}

// Certificate is the server's tls.Config.GetCertificate.
func (s *CAStore) Certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.cert.Load(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("%s: no serving certificate yet", s.name)
}

// Bundle is every CA held, PEM: what clients must trust.
func (s *CAStore) Bundle() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cas.Bundle()
}

// Summary names the CAs held and their expiry, for logs.
func (s *CAStore) Summary() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return describeCAs(s.cas)
}

// Ready says whether the server has a serving certificate valid now.
func (s *CAStore) Ready(now time.Time) error {
	c := s.cert.Load()
	switch {
	case c == nil:
		return fmt.Errorf("%s: no serving certificate yet (CA Secret %s/%s)", s.name, s.namespace, s.secret)
	case !now.Before(c.Leaf.NotAfter):
		return fmt.Errorf("%s: the serving certificate expired at %s and was not renewed", s.name, c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// Describe and Collect make the store a prometheus.Collector of its
// certificates' expiry, read when scraped.
func (s *CAStore) Describe(ch chan<- *prometheus.Desc) { ch <- s.expiry }

func (s *CAStore) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	serving := s.serving
	var signer *CertAuthority
	if serving != nil {
		for _, ca := range s.cas {
			if ca.ID() == serving.issuer {
				signer = ca
			}
		}
	}
	s.mu.Unlock()
	if serving == nil {
		return
	}
	now := time.Now()
	ch <- prometheus.MustNewConstMetric(s.expiry, prometheus.GaugeValue, serving.TLS.Leaf.NotAfter.Sub(now).Seconds(), "serving")
	if signer != nil {
		ch <- prometheus.MustNewConstMetric(s.expiry, prometheus.GaugeValue, signer.Cert.NotAfter.Sub(now).Seconds(), "ca")
	}
}

func describeCAs(cas CASet) []string {
	var out []string
	for _, ca := range cas {
		out = append(out, ca.ID()+" until "+ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return out
}

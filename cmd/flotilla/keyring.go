package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/discovery"
)

// annotationRotation, on a cluster's FederationSecret, names (by
// fingerprint) the key `key rotate` is moving the federation to, so that
// a rerun after an interruption continues with that key.
const annotationRotation = "flotilla.io/rotating-to"

// keyCluster is one cluster whose agent's keyring the key verbs change:
// through the Secret the agent follows and the ConfigMap where it says
// what it holds.
type keyCluster struct {
	// name is the kubeconfig as given, until the agent's status names the
	// cluster.
	name string
	core corev1client.CoreV1Interface
	ns   string
}

func openKeyCluster(kubeconfig, kubeContext, ns string) (*keyCluster, error) {
	name := kubeconfig
	if name == "" {
		name = "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	// No client-side limit: a rotation makes some thirty requests in
	// bursts, which client-go's default (5 a second) stretched from 0.12
	// to 1.2 s on two clusters; the API server's priority and fairness
	// protects it, as for the agent.
	cfg.QPS, cfg.Burst = -1, -1
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &keyCluster{name: name, core: core, ns: ns}, nil
}

// keyStatus is what an agent says of its keyring.
type keyStatus struct {
	cluster string
	keys    []string // fingerprints, primary first
	err     string
}

// status reads what the agent holds.
func (c *keyCluster) status(ctx context.Context) (keyStatus, error) {
	cm, err := c.core.ConfigMaps(c.ns).Get(ctx, agent.FederationKeysStatus, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return keyStatus{}, fmt.Errorf("%s: no ConfigMap %s/%s: is the agent running, and of a version that rotates keys? (`kubectl -n %s logs deploy/flotilla-agent`)",
			c.name, c.ns, agent.FederationKeysStatus, c.ns)
	}
	if err != nil {
		return keyStatus{}, c.apiError("read ConfigMap "+agent.FederationKeysStatus, err)
	}
	return parseKeyStatus(cm), nil
}

func parseKeyStatus(cm *corev1.ConfigMap) keyStatus {
	s := keyStatus{cluster: cm.Data[agent.StatusCluster], err: cm.Data[agent.StatusError]}
	if k := cm.Data[agent.StatusKeys]; k != "" {
		s.keys = strings.Split(k, ",")
	}
	return s
}

func (c *keyCluster) secret(ctx context.Context) (*corev1.Secret, error) {
	s, err := c.core.Secrets(c.ns).Get(ctx, agent.FederationSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, c.apiError("read Secret "+agent.FederationSecret, err)
	}
	return s, nil
}

// keyPool is the keys the verbs know, by fingerprint: from the clusters'
// Secrets and the key files given. An agent's status names its keys by
// fingerprint; the pool turns those back into keys.
type keyPool map[string][]byte

func (p keyPool) add(keys ...[]byte) {
	for _, k := range keys {
		p[discovery.Fingerprint(k)] = k
	}
}

// addSecret adds the keys a cluster's Secret holds; a damaged entry is
// skipped here and reported where the cluster's keyring is read.
func (p keyPool) addSecret(s *corev1.Secret) {
	if s == nil {
		return
	}
	if ring, err := discovery.DecodeKeyring(s.Data[agent.SecretKeyring]); err == nil {
		p.add(ring...)
	}
	if tok, err := discovery.ParseFederationKey(string(s.Data[agent.SecretToken])); err == nil {
		p.add(tok.Key)
	}
}

// ring is the keyring the cluster holds or is asked to hold: the
// Secret's keyring when it has one, else the keys its agent reports,
// found in pool.
func (c *keyCluster) ring(s *corev1.Secret, st keyStatus, pool keyPool) ([][]byte, error) {
	if s != nil && len(s.Data[agent.SecretKeyring]) > 0 {
		ring, err := discovery.DecodeKeyring(s.Data[agent.SecretKeyring])
		if err != nil {
			return nil, fmt.Errorf("%s: Secret %s/%s, %q: %w; fix or delete that entry", c.name, c.ns, agent.FederationSecret, agent.SecretKeyring, err)
		}
		return ring, nil
	}
	if len(st.keys) == 0 {
		return nil, fmt.Errorf("%s: the agent reports no federation key", c.name)
	}
	ring := make([][]byte, 0, len(st.keys))
	for _, fp := range st.keys {
		k, ok := pool[fp]
		if !ok {
			return nil, fmt.Errorf("%s: the agent holds key %s, which no Secret %s of the clusters given holds; pass it with --current-key-file (`flotilla token --context` of that cluster prints it)",
				c.name, fp, agent.FederationSecret)
		}
		ring = append(ring, k)
	}
	return ring, nil
}

// write asks the agent to hold ring, creating the Secret when the
// cluster has none (its key was generated by the agent, or given by
// flag). rotation is the annotation's value; empty removes it. When the
// Secret has a join token, its key follows the primary, so an agent that
// restarts from the mounted token starts with the key in use.
func (c *keyCluster) write(ctx context.Context, ring [][]byte, rotation string) error {
	enc, err := discovery.EncodeKeyring(ring)
	if err != nil {
		return err
	}
	secrets := c.core.Secrets(c.ns)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := secrets.Get(ctx, agent.FederationSecret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: agent.FederationSecret, Namespace: c.ns,
				Labels: map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/managed-by": "flotilla"}}}
			setRing(s, ring, enc, rotation)
			_, err = secrets.Create(ctx, s, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		setRing(s, ring, enc, rotation)
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return c.apiError("write Secret "+agent.FederationSecret, err)
	}
	return nil
}

func setRing(s *corev1.Secret, ring [][]byte, enc []byte, rotation string) {
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[agent.SecretKeyring] = enc
	if tok, err := discovery.ParseFederationKey(string(s.Data[agent.SecretToken])); err == nil && !bytes.Equal(tok.Key, ring[0]) {
		tok.Key = ring[0]
		if t, err := tok.Encode(); err == nil {
			s.Data[agent.SecretToken] = []byte(t)
		}
	}
	if rotation == "" {
		delete(s.Annotations, annotationRotation)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[annotationRotation] = rotation
}

// wait watches the agent's status until it holds exactly want (primary
// first), printing what it holds as that changes. A plain get and watch,
// not an informer: ending it on purpose logs nothing.
func (c *keyCluster) wait(ctx context.Context, w io.Writer, want []string, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last keyStatus
	shown := ""
	see := func(cm *corev1.ConfigMap) bool {
		last = parseKeyStatus(cm)
		if last.cluster != "" {
			c.name = last.cluster
		}
		line := fmt.Sprintf("  %s holds %s", c.name, describeKeys(last.keys))
		if last.err != "" {
			line += " (" + last.err + ")"
		}
		if line != shown {
			shown = line
			fmt.Fprintln(w, line)
		}
		return sameKeys(last.keys, want)
	}
	cms := c.core.ConfigMaps(c.ns)
	field := fields.OneTermEqualSelector("metadata.name", agent.FederationKeysStatus).String()
	for wctx.Err() == nil {
		rv := ""
		cm, err := cms.Get(wctx, agent.FederationKeysStatus, metav1.GetOptions{})
		switch {
		case err == nil:
			if see(cm) {
				return nil
			}
			rv = cm.ResourceVersion
		case apierrors.IsNotFound(err), wctx.Err() != nil:
		default:
			return c.apiError("read ConfigMap "+agent.FederationKeysStatus, err)
		}
		watcher, err := cms.Watch(wctx, metav1.ListOptions{FieldSelector: field, ResourceVersion: rv})
		if err != nil {
			if wctx.Err() != nil {
				break
			}
			return c.apiError("watch ConfigMap "+agent.FederationKeysStatus, err)
		}
		for ev := range watcher.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type != watch.Deleted && see(cm) {
				watcher.Stop()
				return nil
			}
		}
		watcher.Stop() // the server ended the watch: get and watch again
	}
	if ctx.Err() != nil {
		return fmt.Errorf("stopped waiting for %s: the Secret stands and the agent goes on acting on it; rerun to continue", c.name)
	}
	why := ""
	if last.err != "" {
		why = ": " + last.err
	}
	return fmt.Errorf("%s: the agent holds %s after %s, not %s%s (is it running? `kubectl -n %s logs deploy/flotilla-agent`); rerun to continue",
		c.name, describeKeys(last.keys), timeout, describeKeys(want), why, c.ns)
}

// describeKeys names keys by fingerprint, the primary first and marked.
func describeKeys(fps []string) string {
	if len(fps) == 0 {
		return "no key"
	}
	out := slices.Clone(fps)
	out[0] += " (primary)"
	return strings.Join(out, ", ")
}

// apiError says what to do about an API error on the key's objects.
func (c *keyCluster) apiError(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %s: %w; rotating the key takes get, create and update on the Secret %s and get, list and watch on the ConfigMap %s in %s",
			c.name, what, err, agent.FederationSecret, agent.FederationKeysStatus, c.ns)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: %s: the API server did not accept your credentials: %w (check the kubeconfig's user)", c.name, what, err)
	}
	return fmt.Errorf("%s: %s: %w", c.name, what, err)
}

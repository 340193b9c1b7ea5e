package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ipam"
)

// The join token a joining cluster needs, published through the API
// server so that an admin reads it with their own rights (`flotilla token
// --context`, `flotilla join`), with no shell on the gateway host.
const (
	// JoinSecret is the Secret, in the agent's namespace, where the agent
	// publishes the join token of the key it encrypts with (data "token",
	// SecretToken) and its gossip address as the seed. It is a secret: it
	// admits its holder to the federation.
	JoinSecret = "flotilla-join"
	// AnnotationClusterID and AnnotationClusterName, on JoinSecret, name
	// the cluster whose token it is: a joiner waits for the Peer of that
	// name on each side.
	AnnotationClusterID   = "flotilla.io/cluster-id"
	AnnotationClusterName = "flotilla.io/cluster-name"
)

// JoinToken reads the federation key and the gossip address of the agent
// whose state is in stateDir and returns a join token for another cluster
// (`flotilla agent --federation-key <token>`). It works while the agent
// runs. The token is a secret: it admits its holder to the federation.
func JoinToken(stateDir string) (string, error) {
	path := filepath.Join(stateDir, ipam.FileName)
	l, err := ipam.OpenSnapshot(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	defer l.Close()
	ring, err := l.Key(keyFederation)
	if errors.Is(err, ipam.ErrNotFound) {
		return "", fmt.Errorf("%s holds no federation key yet: start the agent once (it generates one)", path)
	}
	if err != nil {
		return "", err
	}
	keys, err := discovery.DecodeKeyring(ring)
	if err != nil || len(keys) == 0 {
		return "", fmt.Errorf("federation keyring in %s: %v", path, err)
	}
	tok := discovery.JoinToken{Key: keys[0]}
	if addr, err := l.Key(keyGossipAdvertise); err == nil {
		tok.Seeds = []string{string(addr)}
	}
	return tok.Encode()
}

// publishJoinToken applies JoinSecret: the token of the key that
// encrypts now, with this agent's gossip address (the address other
// clusters reach, --advertise-addr) as the seed.
func (f *keyFollower) publishJoinToken(ctx context.Context) error {
	keys := f.held.Keys()
	if len(keys) == 0 {
		return nil
	}
	tok := discovery.JoinToken{Key: keys[0]}
	if f.gossip != "" {
		tok.Seeds = []string{f.gossip}
	}
	enc, err := tok.Encode()
	if err != nil {
		return fmt.Errorf("join token: %w", err)
	}
	s := corev1ac.Secret(JoinSecret, f.ns).
		WithLabels(map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/managed-by": "flotilla"}).
		WithAnnotations(map[string]string{AnnotationClusterID: f.clusterID, AnnotationClusterName: f.a.cfg.ClusterName}).
		WithData(map[string][]byte{SecretToken: []byte(enc)})
	if _, err := f.a.kube.CoreV1().Secrets(f.ns).Apply(ctx, s, metav1.ApplyOptions{FieldManager: "flotilla", Force: true}); err != nil {
		return fmt.Errorf("write Secret %s/%s: %w", f.ns, JoinSecret, err)
	}
	return nil
}

package agent

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
)

// The join token's Secret and its annotations, as agentapi names them.
const (
	JoinSecret            = agentapi.JoinSecret
	AnnotationClusterID   = agentapi.AnnotationClusterID
	AnnotationClusterName = agentapi.AnnotationClusterName
)

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

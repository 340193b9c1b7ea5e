package main

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/discovery"
)

// joinSide is one cluster of a join, reached with the user's own
// credentials.
type joinSide struct {
	// name is the context (or kubeconfig) as given, until the agent's
	// published token names the cluster.
	name  string
	ns    string
	core  corev1client.CoreV1Interface
	peers client.WithWatch
}

func openJoinSide(kubeconfig, kubeContext, ns string) (*joinSide, error) {
	ref := clusterRef{kubeconfig: kubeconfig, context: kubeContext}
	cfg, name, err := ref.restConfig()
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = kubeconfig
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	peers, err := ref.client()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &joinSide{name: name, ns: ns, core: core, peers: peers}, nil
}

// named names the side after the cluster its agent says it is.
func (s *joinSide) named(p published) {
	if p.clusterName != "" {
		s.name = p.clusterName
	}
}

// apiError says what to do about an API error on one of the objects a
// join reads or changes on this side.
func (s *joinSide) apiError(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %s: %w; joining takes, in %s there, get, create, update, patch and delete on the Secret %s, get on the Secret %s, list and delete on pods, get on the ConfigMap %s, and list and get on peers.flotilla.io: ask an admin of that cluster",
			s.name, what, err, s.ns, agentapi.FederationSecret, agentapi.JoinSecret, agentapi.FederationKeysStatus)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: %s: the API server did not accept your credentials: %w (check the kubeconfig's user)", s.name, what, err)
	}
	return fmt.Errorf("%s: %s: %w", s.name, what, err)
}

// joinerState is what of A a join reads before it changes anything, and
// what an undo puts back.
type joinerState struct {
	// own is A's published token: its key and cluster ID.
	own published
	// secret is A's Secret flotilla-federation; nil when it has none.
	secret *corev1.Secret
	// peers are A's Peers.
	peers []v1alpha1.Peer
}

func (s *joinSide) state(ctx context.Context) (joinerState, error) {
	own, err := readJoinToken(ctx, s.core, s.ns, s.name)
	if err != nil {
		return joinerState{}, err
	}
	st := joinerState{own: own}
	sec, err := s.core.Secrets(s.ns).Get(ctx, agentapi.FederationSecret, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return joinerState{}, s.apiError("read Secret "+agentapi.FederationSecret, err)
	default:
		st.secret = sec
	}
	var peers v1alpha1.PeerList
	if err := s.peers.List(ctx, &peers); err != nil {
		return joinerState{}, fmt.Errorf("%s: %w", s.name, apiError("list", "", err))
	}
	st.peers = peers.Items
	return st, nil
}

// otherFederation says why A belongs to a federation other than the one
// of key, or "" when joining that one takes A out of none: A holds a key
// it was given (its Secret flotilla-federation) that is not key, or it
// has peers, which hold its key and not key.
func otherFederation(st joinerState, key []byte) string {
	var why []string
	if st.secret != nil {
		for _, k := range secretKeys(st.secret) {
			if !bytes.Equal(k, key) {
				why = append(why, fmt.Sprintf("its Secret %s holds key %s", agentapi.FederationSecret, discovery.Fingerprint(k)))
				break
			}
		}
	}
	if len(st.peers) > 0 {
		names := make([]string, len(st.peers))
		for i, p := range st.peers {
			names[i] = peerName(p)
		}
		sort.Strings(names)
		why = append(why, "its peers are "+strings.Join(names, ", "))
	}
	return strings.Join(why, "; ")
}

// secretKeys are the keys a Secret flotilla-federation holds: its
// keyring's and its token's. Damaged entries hold none.
func secretKeys(s *corev1.Secret) [][]byte {
	var keys [][]byte
	if ring, err := discovery.DecodeKeyring(s.Data[agentapi.SecretKeyring]); err == nil {
		keys = append(keys, ring...)
	}
	if tok, err := discovery.ParseFederationKey(string(s.Data[agentapi.SecretToken])); err == nil {
		keys = append(keys, tok.Key)
	}
	return keys
}

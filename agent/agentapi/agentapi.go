// Package agentapi is what the agent and the operator commands share
// about the agent's state: the names of the federation Secret and of the
// key status the agent writes, and the join token of a state directory.
// It links no tunnel and no nftables, so the CLI that reads them builds
// for every platform, not only the agent's.
package agentapi

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ipam"
)

// Key rotation from the API (docs/operations.md, "Rotating the federation
// key"): an operator, or `flotilla key`, writes the keyring this cluster
// should hold into a Secret; the agent converges its gossip keyring on it
// and reports what it holds, by fingerprint only, in a ConfigMap and in
// metrics. The Secret is the one the install already mounts for
// --federation-key-file, so the key lives in one object per cluster.
const (
	// FederationSecret is the Secret, in the agent's namespace, that holds
	// the join token (data "token", read through the API server at start,
	// or from its mounted file) and the keyring the agent follows (data
	// "keyring").
	FederationSecret = "flotilla-federation"
	// SecretKeyring is the Secret's entry with the keyring, encoded by
	// discovery.EncodeKeyring: the primary (encrypting) key first, then the
	// keys that only decrypt. Listed keys are installed, the first made
	// primary, and unlisted keys removed, in that order.
	SecretKeyring = "keyring"
	// SecretToken is the Secret's entry with the join token.
	SecretToken = "token"
	// FederationKeysStatus is the ConfigMap, in the agent's namespace,
	// where the agent says which keys it holds: fingerprints, never keys.
	FederationKeysStatus = "flotilla-federation-keys"
	// StatusKeys is the status entry with the fingerprints of the keys
	// the agent holds, primary first, comma separated; StatusError says why
	// the Secret's keyring was not applied (empty when it was);
	// StatusCluster names the cluster.
	StatusKeys    = "keys"
	StatusError   = "error"
	StatusCluster = "cluster"
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

// DefaultStateDir is where the agent keeps its ledger unless told.
const DefaultStateDir = "/var/lib/flotilla"

// The ledger's entries the agent keeps its federation keyring and its
// gossip address in.
const (
	LedgerKeyring         = "federation-keyring"
	LedgerGossipAdvertise = "gossip-advertise"
)

// Fingerprints are the public names of keys, in order.
func Fingerprints(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = discovery.Fingerprint(k)
	}
	return out
}

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
	ring, err := l.Key(LedgerKeyring)
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
	if addr, err := l.Key(LedgerGossipAdvertise); err == nil {
		tok.Seeds = []string{string(addr)}
	}
	return tok.Encode()
}

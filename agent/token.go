package agent

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ipam"
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

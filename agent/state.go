package agent

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/identity"
	"github.com/flotilla-io/flotilla/ipam"
)

// Ledger keys the agent stores besides what ipam and peering keep.
const (
	keyIdentity        = "identity"
	keyWireGuard       = "wireguard"
	keyFederation      = agentapi.LedgerKeyring
	keyGossipAdvertise = agentapi.LedgerGossipAdvertise
)

// state is what the agent keeps about itself: the ledger, and in it the
// cluster's identity.
type state struct {
	ledger *ipam.Ledger
	id     identity.Identity
}

// openState opens the ledger, closed last when the agent stops, and loads
// the cluster's identity from it, creating one at first start.
func (a *Agent) openState(comps *components) (state, error) {
	ledger, err := ipam.Open(filepath.Join(a.cfg.StateDir, ipam.FileName), ipam.Options{Now: a.now})
	if err != nil {
		return state{}, fmt.Errorf("open ledger: %w", err)
	}
	comps.OnStop("ledger", ledger.Close)
	a.registry.MustRegister(newPoolCollector(ledger))
	a.ready.add("ledger", func() error {
		_, err := os.Stat(ledger.Path()) // deleted under a running agent: say so
		return err
	})
	seed, err := ledger.LoadOrCreateKey(keyIdentity, func() ([]byte, error) {
		id, err := identity.Generate()
		return id.Seed(), err
	})
	if err != nil {
		return state{}, fmt.Errorf("identity: %w", err)
	}
	id, err := identity.FromSeed(seed)
	if err != nil {
		return state{}, fmt.Errorf("identity in the ledger: %w", err)
	}
	a.log.Info("identity", "clusterID", id.ClusterID(), "name", a.cfg.ClusterName)
	return state{ledger: ledger, id: id}, nil
}

type federationKeyring struct {
	keys  [][]byte
	seeds []string
}

// federationKeys returns the keyring from the Secret flotilla-federation
// (fromSecret, read by secretKeyring), the flags or the ledger, generating
// one at first start, and stores it so `flotilla token` can print it.
func (a *Agent) federationKeys(ledger *ipam.Ledger, fromSecret [][]byte) (federationKeyring, error) {
	tok, given, err := a.givenKey()
	if err != nil {
		return federationKeyring{}, err
	}
	keys := [][]byte{tok.Key}
	if fromSecret != nil {
		// The Secret's keyring is what a rotation last asked for: it wins
		// over a token on the command line or in a file, which still names
		// the key the cluster joined with.
		keys, given = fromSecret, true
	}
	if given {
		ring, err := discovery.EncodeKeyring(keys)
		if err != nil {
			return federationKeyring{}, err
		}
		if err := ledger.PutKey(keyFederation, ring); err != nil {
			return federationKeyring{}, fmt.Errorf("store the federation keyring: %w", err)
		}
		return federationKeyring{keys: keys, seeds: tok.Seeds}, nil
	}
	ring, err := ledger.LoadOrCreateKey(keyFederation, func() ([]byte, error) {
		k, err := discovery.GenerateFederationKey()
		if err != nil {
			return nil, err
		}
		a.log.Info("generated a new federation key; `flotilla token` prints a join token for other clusters")
		return discovery.EncodeKeyring([][]byte{k})
	})
	if err != nil {
		return federationKeyring{}, fmt.Errorf("federation key: %w", err)
	}
	keys, err = discovery.DecodeKeyring(ring)
	if err != nil {
		return federationKeyring{}, fmt.Errorf("federation keyring in the ledger: %w", err)
	}
	return federationKeyring{keys: keys}, nil
}

// givenKey is the join token or key of --federation-key or
// --federation-key-file; ok is false when neither is given.
func (a *Agent) givenKey() (tok discovery.JoinToken, ok bool, err error) {
	given := a.cfg.FederationKey
	if given != "" {
		a.log.Warn("the federation key was given on the command line, where every process on this host can read it; prefer --federation-key-file")
	}
	if a.cfg.FederationKeyFile != "" {
		b, err := os.ReadFile(a.cfg.FederationKeyFile)
		if err != nil {
			return tok, false, fmt.Errorf("--federation-key-file: %w", err)
		}
		given = string(b)
	}
	if given == "" {
		return tok, false, nil
	}
	if tok, err = discovery.ParseFederationKey(given); err != nil {
		return tok, false, fmt.Errorf("federation key: %w", err)
	}
	return tok, true, nil
}

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ha"
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

// openState opens the ledger, closed last when the agent stops, brings it
// to its newest snapshot when it is behind (restoreLedger; snap is the
// snapshot's read, started before the ledger opened), and loads the
// cluster's identity from it, creating one at first start.
func (a *Agent) openState(comps *components, snap *background[*ipam.Snapshot]) (state, error) {
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
	if err := a.restoreLedger(comps, ledger, snap); err != nil {
		return state{}, err
	}
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
	a.registry.MustRegister(clusterInfo(a.cfg.ClusterName, id.ClusterID()))
	return state{ledger: ledger, id: id}, nil
}

// ledgerSnapshots is where the ledger is replicated, nil without
// --ledger-snapshots.
func (a *Agent) ledgerSnapshots() *ha.Snapshots {
	if !a.cfg.LedgerSnapshots {
		return nil
	}
	return &ha.Snapshots{Kube: a.kube, Namespace: a.agentNamespace(), Log: a.log.With("component", "ledger snapshots")}
}

// newestLedgerSnapshot reads the ledger's snapshot from the Secret
// flotilla-ledger: nil when there is none or snapshots are off.
func (a *Agent) newestLedgerSnapshot(ctx context.Context) (*ipam.Snapshot, error) {
	snaps := a.ledgerSnapshots()
	if snaps == nil {
		return nil, nil
	}
	return snaps.Newest(ctx)
}

// restoreLedger restores the ledger from the Secret flotilla-ledger when
// another replica wrote it since this state directory last did (or the
// directory is new), then keeps writing the ledger's snapshots there
// after its changes. A state directory with nothing in it does not start
// on a snapshot it cannot read: it would make a new identity.
func (a *Agent) restoreLedger(comps *components, ledger *ipam.Ledger, read *background[*ipam.Snapshot]) error {
	snaps := a.ledgerSnapshots()
	if snaps == nil {
		return nil
	}
	snap, err := read.wait()
	if err == nil {
		_, err = snaps.RestoreFrom(ledger, snap, keyIdentity)
	}
	switch {
	case err != nil && ledger.Generation() == 0:
		return fmt.Errorf("ledger: this state directory is empty and its snapshot cannot be restored: %w", err)
	case err != nil:
		a.log.Warn("starting from the local ledger; its snapshot was not restored", "err", err)
	}
	comps.Go("ledger snapshots", func(ctx context.Context) error { return snaps.Run(ctx, ledger) })
	return nil
}

type federationKeyring struct {
	keys  [][]byte
	seeds []string
}

// federationKeys returns the keyring from the Secret flotilla-federation
// (fromSecret, read by secretFederation), the flags or the ledger,
// generating one at first start, and stores it so `flotilla token` can
// print it. The seeds are those of every token given.
func (a *Agent) federationKeys(ledger *ipam.Ledger, fromSecret secretKeys) (federationKeyring, error) {
	tok, given, err := a.givenKey()
	if err != nil {
		return federationKeyring{}, err
	}
	keys := [][]byte{tok.Key}
	seeds := tok.Seeds
	if fromSecret.token != nil {
		// The Secret's token is what `flotilla join` or the operator last
		// asked for: it wins over a token on the command line or in a
		// file (which, as installed, is this Secret mounted).
		keys, given = [][]byte{fromSecret.token.Key}, true
		for _, s := range fromSecret.token.Seeds {
			if !slices.Contains(seeds, s) {
				seeds = append(seeds, s)
			}
		}
	}
	if fromSecret.keys != nil {
		// The Secret's keyring is what a rotation last asked for: it wins
		// over a token, which still names the key the cluster joined with.
		keys, given = fromSecret.keys, true
	}
	if given {
		ring, err := discovery.EncodeKeyring(keys)
		if err != nil {
			return federationKeyring{}, err
		}
		if err := ledger.PutKey(keyFederation, ring); err != nil {
			return federationKeyring{}, fmt.Errorf("store the federation keyring: %w", err)
		}
		return federationKeyring{keys: keys, seeds: seeds}, nil
	}
	ring, err := ledger.LoadOrCreateKey(keyFederation, func() ([]byte, error) {
		k, err := discovery.GenerateFederationKey()
		if err != nil {
			return nil, err
		}
		a.log.Info("generated a new federation key; `flotilla token --context` prints a join token for other clusters, `flotilla join` joins one")
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

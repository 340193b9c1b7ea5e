package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

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
// cluster's identity from it, creating one at first start. A ledger
// never replicated writes its first snapshot before the identity is used
// (firstSnapshot).
func (a *Agent) openState(ctx context.Context, comps *components, snap *background[*ipam.Snapshot]) (state, error) {
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
	snaps := a.ledgerSnapshots()
	if err := a.restoreLedger(snaps, ledger, snap); err != nil {
		return state{}, err
	}
	id, err := loadIdentity(ledger)
	if err != nil {
		return state{}, err
	}
	if snaps != nil {
		if id, err = a.firstSnapshot(ctx, snaps, ledger, id); err != nil {
			return state{}, err
		}
		comps.Go("ledger snapshots", func(ctx context.Context) error { return snaps.Run(ctx, ledger) })
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

// loadIdentity is the cluster's identity in the ledger, made and stored
// there when it has none.
func loadIdentity(ledger *ipam.Ledger) (identity.Identity, error) {
	seed, err := ledger.LoadOrCreateKey(keyIdentity, func() ([]byte, error) {
		id, err := identity.Generate()
		return id.Seed(), err
	})
	if err != nil {
		return identity.Identity{}, fmt.Errorf("identity: %w", err)
	}
	id, err := identity.FromSeed(seed)
	if err != nil {
		return identity.Identity{}, fmt.Errorf("identity in the ledger: %w", err)
	}
	return id, nil
}

// firstSnapshotTimeout bounds the first snapshot's write at the start.
const firstSnapshotTimeout = 5 * time.Second

// firstSnapshot writes the first snapshot of a ledger that never wrote
// nor restored one (its identity just made, as a rule) before anything
// uses that identity, so that a replica taking over after this one finds
// it instead of making another. When another replica wrote first (two
// replicas each made an identity at install), this ledger yields to the
// snapshot the cluster recorded (ipam.Ledger.Restore keeps it aside) and
// the identity returned is the snapshot's. A write that fails otherwise
// is left to the snapshots' writer, which retries: the start goes on.
func (a *Agent) firstSnapshot(ctx context.Context, snaps *ha.Snapshots, ledger *ipam.Ledger, id identity.Identity) (identity.Identity, error) {
	if ledger.Replicated() != 0 || ledger.Generation() == 0 {
		return id, nil
	}
	ctx, cancel := context.WithTimeout(ctx, firstSnapshotTimeout)
	defer cancel()
	switch err := snaps.Write(ctx, ledger); {
	case err == nil:
		return id, nil
	case !errors.Is(err, ha.ErrSuperseded):
		a.log.Warn("the ledger's first snapshot was not written at the start; the snapshots' writer retries", "err", err)
		return id, nil
	}
	a.log.Warn("another replica recorded the cluster's state first: this replica's new identity yields to it", "clusterID", id.ClusterID())
	if _, err := snaps.Restore(ctx, ledger, keyIdentity); err != nil {
		return identity.Identity{}, fmt.Errorf("ledger: another replica recorded the cluster's state first and it cannot be restored: %w", err)
	}
	return loadIdentity(ledger)
}

// restoreLedger restores the ledger from the Secret flotilla-ledger
// (snaps; nil without snapshots) when another replica wrote it since
// this state directory last did (or the directory is new). A state
// directory with nothing in it does not start on a snapshot it cannot
// read: it would make a new identity.
func (a *Agent) restoreLedger(snaps *ha.Snapshots, ledger *ipam.Ledger, read *background[*ipam.Snapshot]) error {
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

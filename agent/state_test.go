package agent

import (
	"github.com/flotilla-io/flotilla/agent/agentapi"

	"bytes"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ipam"
)

// Where the agent takes its federation key from at start, first that
// applies: the Secret's keyring, the Secret's token, the flags, the
// ledger (generated at the first start). What it takes is stored in the
// ledger, and the seeds of every token given are joined.
func TestFederationKeysOrder(t *testing.T) {
	ledgerKey, flagKey, tokenKey, ringKey := testKey(1), testKey(2), testKey(3), testKey(4)
	token := func(k []byte, seed string) discovery.JoinToken {
		return discovery.JoinToken{Key: k, Seeds: []string{seed}}
	}
	flag := func(k []byte, seed string) string {
		s, err := token(k, seed).Encode()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	secretToken := token(tokenKey, "192.0.2.3:7946")
	for _, c := range []struct {
		name      string
		flag      string
		secret    secretKeys
		want      []byte
		wantSeeds []string
	}{
		{"the ledger alone", "", secretKeys{}, ledgerKey, nil},
		{"the flag over the ledger", flag(flagKey, "192.0.2.2:7946"), secretKeys{}, flagKey, []string{"192.0.2.2:7946"}},
		{"the Secret's token over the flag", flag(flagKey, "192.0.2.2:7946"), secretKeys{token: &secretToken}, tokenKey, []string{"192.0.2.2:7946", "192.0.2.3:7946"}},
		{"the Secret's token over the ledger", "", secretKeys{token: &secretToken}, tokenKey, []string{"192.0.2.3:7946"}},
		{"the Secret's keyring over its token", "", secretKeys{keys: [][]byte{ringKey}, token: &secretToken}, ringKey, []string{"192.0.2.3:7946"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := ipam.Open(filepath.Join(t.TempDir(), ipam.FileName), ipam.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ring, _ := discovery.EncodeKeyring([][]byte{ledgerKey})
			if err := l.PutKey(keyFederation, ring); err != nil {
				t.Fatal(err)
			}
			a := &Agent{cfg: Config{FederationKey: c.flag}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			got, err := a.federationKeys(l, c.secret)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.keys) != 1 || !bytes.Equal(got.keys[0], c.want) {
				t.Errorf("keys %v, want %v", agentapi.Fingerprints(got.keys), agentapi.Fingerprints([][]byte{c.want}))
			}
			if !slices.Equal(got.seeds, c.wantSeeds) {
				t.Errorf("seeds %v, want %v", got.seeds, c.wantSeeds)
			}
			stored, err := l.Key(keyFederation)
			if err != nil {
				t.Fatal(err)
			}
			if keys, _ := discovery.DecodeKeyring(stored); len(keys) != 1 || !bytes.Equal(keys[0], c.want) {
				t.Errorf("the ledger holds %v, want %v", agentapi.Fingerprints(keys), agentapi.Fingerprints([][]byte{c.want}))
			}
		})
	}
}

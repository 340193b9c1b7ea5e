package federation

import (
	"context"
	"fmt"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/ipam"
)

// SnapshotCurrent says whether c's ledger snapshot (the Secret
// ha.SecretName) holds everything its ledger on disk committed: nil when
// the two are at the same generation.
func (c *Cluster) SnapshotCurrent() error {
	l, err := ipam.OpenSnapshot(filepath.Join(c.StateDir, ipam.FileName))
	if err != nil {
		return err
	}
	defer l.Close()
	sec, err := c.CP.Client.CoreV1().Secrets(AgentNamespace).Get(context.Background(), ha.SecretName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	s, err := ipam.DecodeSnapshot(sec.Data[ha.SecretKey])
	if err != nil {
		return err
	}
	if s.Generation != l.Generation() {
		return fmt.Errorf("snapshot at generation %d, the ledger at %d", s.Generation, l.Generation())
	}
	return nil
}

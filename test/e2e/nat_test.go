package e2e

import (
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Cluster b's gateway sits behind a masquerading router that lets nothing
// in; cluster a is on the LAN. b joins a by its seed, and they peer: the
// Peers connect and pods talk both ways by their views, a's pod reaching
// b's through the tunnel b opened.
func TestPeeringBehindNAT(t *testing.T) {
	requireAll(t)
	env := harness.New(t)
	cs := federation.New(t, env, federation.Options{
		PodCIDRs: sameCIDR3[:2], BehindNAT: []int{1}, Args: []string{"--mdns=false"},
		ArgsFor: func(i int, cs []*federation.Cluster) []string {
			if i == 0 {
				return nil
			}
			return []string{"--join", cs[0].Site.Addr.String() + ":7946"}
		},
	})
	federation.Connect(t, cs)
	federation.AllPairsTalk(t, cs)
	// Past memberlist's suspicion and the peers' resends: b, which a
	// cannot dial, is still a live member of a's and still Connected.
	time.Sleep(20 * time.Second)
	federation.WaitPhases(t, cs, v1alpha1.PhaseConnected, 10*time.Second)
	federation.AllPairsTalk(t, cs)
}

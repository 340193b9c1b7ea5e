package harness

import (
	"os"
	"testing"
)

// ParallelEnvVar set to "0" makes LongRunning tests run one after
// another, to tell a failure of load from one of the test.
const ParallelEnvVar = "FLOTILLA_E2E_PARALLEL"

// LongRunning marks a test that brings up real parts (control planes,
// nodes, network namespaces) and takes seconds to minutes: such tests run
// beside each other, as many as go test's -parallel (GOMAXPROCS, two on
// the 2-core CI machine), once every other test of the package has
// ended. Each run has its own namespaces, links, names, ports and files,
// so they do not meet. A test that checks or changes host-wide state
// (HoldNodesAlone, a sweep, a fake dead run) must not call it: it runs
// before them, alone in its package.
func LongRunning(t *testing.T) {
	if os.Getenv(ParallelEnvVar) != "0" {
		t.Parallel()
	}
}

package agent

import (
	"encoding/json"
	"net/http"

	"github.com/flotilla-io/flotilla/internal/version"
	"github.com/flotilla-io/flotilla/peering/protocol"
)

// Build is this binary's build and the peering protocol range it speaks:
// what `flotilla version` prints and the agent serves on /build.
func Build() version.Info { return protocol.Build() }

// serveBuild answers /build with Build as JSON. Not /version: Kubernetes
// lets every account get that path (system:public-info-viewer), and the
// metrics port serves only who was granted.
func serveBuild(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_ = json.NewEncoder(w).Encode(Build())
}

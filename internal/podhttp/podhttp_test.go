package podhttp

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/test/harness"
)

// A forward to a pod that is not there fails at once, naming the pod and
// the port, with nothing left running.
func TestOpenAMissingPod(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("cp", harness.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), readyWait+10*time.Second)
	defer cancel()
	f, err := Open(ctx, cp.Config, "default", "nobody", 9470)
	if err == nil {
		f.Close()
		t.Fatal("a forward to a missing pod opened")
	}
	if !strings.Contains(err.Error(), "pod default/nobody port 9470") || ctx.Err() != nil {
		t.Fatalf("err %v (context %v); want the pod and port named, before the context ended", err, ctx.Err())
	}
	if _, err := Get(ctx, cp.Config, "default", "nobody", 9470, "/metrics"); err == nil || !strings.Contains(err.Error(), "default/nobody") {
		t.Fatalf("Get of a missing pod: %v", err)
	}
}

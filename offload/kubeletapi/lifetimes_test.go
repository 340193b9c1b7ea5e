package kubeletapi

import (
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/offload/internal/certs"
)

// The kubelet API's new CA signs as late as it can: until then the old
// one does, and its last serving certificates still run their full 7
// days, so an operator has months to copy the new bundle into
// --kubelet-certificate-authority.
func TestKubeletCASchedule(t *testing.T) {
	l := Lifetimes(Config{})
	if err := l.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cas, _, err := certs.CASet(nil).Rotated("test", start, l.CA)
	if err != nil {
		t.Fatal(err)
	}
	old := cas[0]
	rotate := cas.RotateAt(l.CA)
	cas, _, err = cas.Rotated("test", rotate.Add(time.Second), l.CA)
	if err != nil || len(cas) != 2 {
		t.Fatalf("at the rotation: %d CAs, %v", len(cas), err)
	}
	fresh := cas[1]
	published := map[string]time.Time{old.ID(): old.Made(), fresh.ID(): fresh.Made()}
	switchAt := fresh.Made().Add(l.Publish)
	if s := cas.Signer(published, switchAt.Add(-time.Second), l.Publish); s != old {
		t.Errorf("the new CA signs %s before the old one can no longer cover a serving certificate", time.Second)
	}
	if s := cas.Signer(published, switchAt, l.Publish); s != fresh {
		t.Errorf("the new CA does not sign once the old one cannot cover a serving certificate")
	}
	if left := old.Cert.NotAfter.Sub(switchAt); left < l.Serving-time.Minute {
		t.Errorf("the old CA's last serving certificate runs %s, less than %s", left, l.Serving)
	}
	if d := switchAt.Sub(fresh.Made()); d < 100*24*time.Hour {
		t.Errorf("the new CA signs %s after it is in the Secret; want months", d)
	}
}

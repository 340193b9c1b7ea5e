package harness_test

import (
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
)

// A site cut from the LAN reaches no other site and no other site reaches
// it, while the rest of the LAN still talks; healed, it talks again.
func TestLANCutAndHeal(t *testing.T) {
	harness.LongRunning(t)
	harness.Require(t, harness.NeedsNetwork...)
	env := harness.New(t)
	lan := env.NewLAN("lan")
	a := env.NewSite("a", harness.SiteOptions{LAN: lan})
	b := env.NewSite("b", harness.SiteOptions{LAN: lan})
	c := env.NewSite("c", harness.SiteOptions{LAN: lan})
	if err := a.Ping(b.Addr); err != nil {
		t.Fatalf("a to b before the cut: %v", err)
	}
	if err := lan.Cut(b.Addr); err != nil {
		t.Fatal(err)
	}
	// The witness that the LAN still works, before the negative checks.
	if err := a.Ping(c.Addr); err != nil {
		t.Fatalf("a to c while b is cut: %v", err)
	}
	if err := a.Ping(b.Addr); err == nil {
		t.Errorf("a reached b while b was cut")
	}
	if err := b.Ping(c.Addr); err == nil {
		t.Errorf("b reached c while cut")
	}
	if err := lan.Heal(b.Addr); err != nil {
		t.Fatal(err)
	}
	if err := a.Ping(b.Addr); err != nil {
		t.Errorf("a to b after the heal: %v", err)
	}
}

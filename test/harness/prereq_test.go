package harness

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// recordTB records how Require ended a test.
type recordTB struct {
	TB
	fatal, skip string
}

func (r *recordTB) Helper() {}
func (r *recordTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(r)
}
func (r *recordTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	panic(r)
}

func requireOutcome(t *testing.T, ci string, req Requirement) (r *recordTB) {
	t.Setenv("CI", ci)
	r = &recordTB{}
	defer func() { recover() }()
	Require(r, req)
	return r
}

// Under CI a missing prerequisite fails the test and says how to install
// it; elsewhere it skips the test with the same advice.
func TestRequireNamesTheFix(t *testing.T) {
	missing := Requirement{Name: "containerd", Check: func() error { return errors.New("not on PATH") }, Fix: aptFix + "containerd"}
	ci := requireOutcome(t, "true", missing)
	if ci.fatal == "" || !strings.Contains(ci.fatal, "apt-get install -y --no-install-recommends containerd") {
		t.Errorf("under CI: fatal %q skip %q, want a failure naming the apt-get command", ci.fatal, ci.skip)
	}
	local := requireOutcome(t, "false", missing)
	if local.skip == "" || !strings.Contains(local.skip, "containerd") || local.fatal != "" {
		t.Errorf("outside CI: fatal %q skip %q, want a skip naming the fix", local.fatal, local.skip)
	}
	met := requireOutcome(t, "true", Requirement{Name: "x", Check: func() error { return nil }})
	if met.fatal != "" || met.skip != "" {
		t.Errorf("a met requirement ended the test: %q %q", met.fatal, met.skip)
	}
}

// Every real-node requirement names a fix.
func TestNodeRequirementsNameFixes(t *testing.T) {
	for _, r := range NeedsNodes {
		if r.Fix == "" || r.Name == "" {
			t.Errorf("requirement %+v has no name or fix", r)
		}
	}
}

package deploy

import (
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/offload/tenancy"
)

// The agent proves in force every binding deploy/ installs, each of a
// policy deploy/ installs, and its dry runs exercise policies among them.
func TestAdmissionBindingsNamed(t *testing.T) {
	bindings, err := AdmissionBindings()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range bindings {
		if b.Spec.PolicyName != b.Name {
			t.Errorf("binding %s binds policy %s: deploy/ names each binding after its policy", b.Name, b.Spec.PolicyName)
		}
		names = append(names, b.Spec.PolicyName)
	}
	for _, want := range append(tenancy.ProbedPolicies(), "flotilla-consumer-pods", "flotilla-agent-fabric") {
		if !slices.Contains(names, want) {
			t.Errorf("AdmissionBindings() bind %v: no %s", names, want)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) {
		t.Errorf("a policy is bound twice: %v", names)
	}
}

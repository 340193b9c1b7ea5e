package deploy

import (
	"slices"
	"testing"

	"github.com/flotilla-io/flotilla/offload/tenancy"
)

// The agent proves in force every policy deploy/ installs, and its dry
// runs exercise policies that are among them.
func TestAdmissionPoliciesNamed(t *testing.T) {
	names, err := AdmissionPolicies()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append(tenancy.ProbedPolicies(), "flotilla-consumer-pods") {
		if !slices.Contains(names, want) {
			t.Errorf("AdmissionPolicies() = %v: no %s", names, want)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) {
		t.Errorf("a policy is named twice: %v", names)
	}
}

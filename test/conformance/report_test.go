package conformance

import (
	"bytes"
	"strings"
	"testing"
)

// A report as Ginkgo writes it (-ginkgo.json-report), trimmed to the
// fields read: a BeforeSuite node, a passed Required spec, a failed
// ClusterIP DNS spec with the suite's non-conformance note, a skipped
// spec, and a timed-out one.
const sampleReport = `[{"SuiteDescription":"Conformance Suite","SpecReports":[
 {"LeafNodeType":"BeforeSuite","State":"passed"},
 {"ContainerHierarchyTexts":["","Exporting a ClusterIP service"],"ContainerHierarchyLabels":[[],["ClusterIP"]],
  "LeafNodeType":"It","LeafNodeText":"should create a ServiceImport","LeafNodeLabels":["Required"],"State":"passed"},
 {"ContainerHierarchyTexts":[""],"ContainerHierarchyLabels":[["Optional","DNS","ClusterIP"]],
  "LeafNodeType":"It","LeafNodeText":"should resolve SRV records","LeafNodeLabels":[],"State":"failed",
  "Failure":{"Message":"Expected\n    <[]string>: []\nto equal ..."},
  "ReportEntries":[{"Name":"spec-ref","Value":{"Representation":"https://kep"}},{"Name":"non-conformant","Value":{"Representation":"The SRV records were not as expected"}}]},
 {"ContainerHierarchyTexts":[""],"ContainerHierarchyLabels":[["Optional","EndpointSlice"]],
  "LeafNodeType":"It","LeafNodeText":"should have endpoint slices","LeafNodeLabels":["Optional"],"State":"skipped"},
 {"ContainerHierarchyTexts":[""],"ContainerHierarchyLabels":[["Required"]],
  "LeafNodeType":"It","LeafNodeText":"should be inaccessible","LeafNodeLabels":["Connectivity","Vendor"],"State":"timedout",
  "Failure":{"Message":"A spec timeout occurred"}}
]}]`

func TestReadSpecsAndCountByLabel(t *testing.T) {
	specs, err := ReadSpecs(strings.NewReader(sampleReport))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 4 {
		t.Fatalf("%d specs, want the 4 Its: %+v", len(specs), specs)
	}
	dns := specs[1]
	if dns.Text != "should resolve SRV records" || strings.Join(dns.Labels, ",") != "ClusterIP,DNS,Optional" {
		t.Errorf("spec %q labels %v", dns.Text, dns.Labels)
	}
	if !strings.HasPrefix(dns.Reason, "non-conformant: The SRV records were not as expected; Expected") {
		t.Errorf("reason %q, want the non-conformance note, then the failure", dns.Reason)
	}
	if specs[0].Text != "Exporting a ClusterIP service should create a ServiceImport" || specs[0].Reason != "" {
		t.Errorf("passed spec %+v", specs[0])
	}
	want := map[string]Count{
		"Required":      {Label: "Required", Passed: 1, Failed: 1},
		"Optional":      {Label: "Optional", Failed: 1, Skipped: 1},
		"ClusterIP":     {Label: "ClusterIP", Passed: 1, Failed: 1},
		"DNS":           {Label: "DNS", Failed: 1},
		"Connectivity":  {Label: "Connectivity", Failed: 1},
		"EndpointSlice": {Label: "EndpointSlice", Skipped: 1},
		"Headless":      {Label: "Headless"},
		"Vendor":        {Label: "Vendor", Failed: 1},
	}
	counts := CountByLabel(specs)
	if last := counts[len(counts)-1]; last.Label != "Vendor" {
		t.Errorf("last label %q, want the suite's other label Vendor after the known ones", last.Label)
	}
	for _, c := range counts {
		if w, ok := want[c.Label]; ok && c != w {
			t.Errorf("label %s: %+v, want %+v", c.Label, c, w)
		}
	}
	var out bytes.Buffer
	if err := WriteSummary(&out, specs); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"TIMEDOUT: should be inaccessible", "FAILED: should resolve SRV records", "A spec timeout occurred", "1 passed, 2 failed, 1 skipped"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("summary lacks %q:\n%s", line, out.String())
		}
	}
}

// What is not a Ginkgo report is refused with an error that says so.
func TestReadSpecsRefusesBadReports(t *testing.T) {
	for name, in := range map[string]string{
		"not JSON":       "report.html",
		"no suite":       "[]",
		"an object":      `{"SpecReports":[]}`,
		"a spec unended": `[{"SpecReports":[{"LeafNodeType":"It","LeafNodeText":"x"}]}]`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ReadSpecs(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), "the suite's JSON report") {
				t.Errorf("error %v, want one about the suite's JSON report", err)
			}
		})
	}
}

package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Labels are the suite's labels, in the order a summary lists them.
var Labels = []string{"Required", "Optional", "DNS", "Connectivity", "ClusterIP", "Headless", "ExternalName", "EndpointSlice", "ExportedLabels", "StrictPortConflict"}

// Spec is one spec (a Ginkgo It) as the suite's JSON report has it.
type Spec struct {
	Text   string   // the container texts and the spec's own, joined
	Labels []string // the containers' and the spec's, sorted, unique
	State  string   // passed, failed, skipped, panicked, timedout, ...
	// Reason is the failure's message (for a failed spec) as the suite
	// printed it, with its non-conformance note first when it made one.
	Reason string
}

// Passed and Skipped say how a spec ended; any other state is a failure.
func (s Spec) Passed() bool  { return s.State == "passed" }
func (s Spec) Skipped() bool { return s.State == "skipped" || s.State == "pending" }

// Count is one label's tally.
type Count struct {
	Label                   string
	Passed, Failed, Skipped int
}

// ginkgoReport is the part of Ginkgo's JSON report (-ginkgo.json-report)
// read here.
type ginkgoReport struct {
	SuiteDescription string
	SpecReports      []struct {
		ContainerHierarchyTexts  []string
		ContainerHierarchyLabels [][]string
		LeafNodeType             string
		LeafNodeText             string
		LeafNodeLabels           []string
		State                    string
		Failure                  *struct{ Message string }
		ReportEntries            []struct {
			Name  string
			Value struct{ Representation string }
		}
	}
}

// ReadSpecs reads the specs of a Ginkgo JSON report: only Its, not the
// suite's set-up and reporting nodes.
func ReadSpecs(r io.Reader) ([]Spec, error) {
	var reports []ginkgoReport
	if err := json.NewDecoder(r).Decode(&reports); err != nil {
		return nil, fmt.Errorf("read the suite's JSON report: %w", err)
	}
	if len(reports) == 0 {
		return nil, fmt.Errorf("read the suite's JSON report: no suite in it")
	}
	var specs []Spec
	for _, rep := range reports {
		for _, sr := range rep.SpecReports {
			if sr.LeafNodeType != "It" {
				continue
			}
			if sr.State == "" {
				return nil, fmt.Errorf("read the suite's JSON report: spec %q has no state", sr.LeafNodeText)
			}
			s := Spec{State: sr.State, Labels: slices.Clone(sr.LeafNodeLabels)}
			var texts []string
			for _, t := range append(slices.Clone(sr.ContainerHierarchyTexts), sr.LeafNodeText) {
				if t = strings.TrimSpace(t); t != "" {
					texts = append(texts, t)
				}
			}
			s.Text = strings.Join(texts, " ")
			for _, ls := range sr.ContainerHierarchyLabels {
				s.Labels = append(s.Labels, ls...)
			}
			slices.Sort(s.Labels)
			s.Labels = slices.Compact(s.Labels)
			if !s.Passed() && !s.Skipped() {
				var reason []string
				for _, e := range sr.ReportEntries {
					if e.Name == "non-conformant" && e.Value.Representation != "" {
						reason = append(reason, "non-conformant: "+e.Value.Representation)
					}
				}
				if sr.Failure != nil {
					reason = append(reason, strings.TrimSpace(sr.Failure.Message))
				}
				s.Reason = strings.Join(reason, "; ")
			}
			specs = append(specs, s)
		}
	}
	return specs, nil
}

// CountByLabel tallies specs per label, Labels' first, then any other
// label the suite used, by name.
func CountByLabel(specs []Spec) []Count {
	labels := slices.Clone(Labels)
	var others []string
	for _, s := range specs {
		for _, l := range s.Labels {
			if !slices.Contains(labels, l) && !slices.Contains(others, l) {
				others = append(others, l)
			}
		}
	}
	slices.Sort(others)
	var out []Count
	for _, l := range append(labels, others...) {
		c := Count{Label: l}
		for _, s := range specs {
			if !slices.Contains(s.Labels, l) {
				continue
			}
			switch {
			case s.Passed():
				c.Passed++
			case s.Skipped():
				c.Skipped++
			default:
				c.Failed++
			}
		}
		out = append(out, c)
	}
	return out
}

// WriteSummary writes the pass, fail and skip counts per label, the
// totals, and every failed spec with its reason's first lines.
func WriteSummary(w io.Writer, specs []Spec) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LABEL\tPASSED\tFAILED\tSKIPPED")
	for _, c := range CountByLabel(specs) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", c.Label, c.Passed, c.Failed, c.Skipped)
	}
	var total Count
	for _, s := range specs {
		switch {
		case s.Passed():
			total.Passed++
		case s.Skipped():
			total.Skipped++
		default:
			total.Failed++
		}
	}
	fmt.Fprintf(tw, "all specs\t%d\t%d\t%d\n", total.Passed, total.Failed, total.Skipped)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range specs {
		if s.Passed() || s.Skipped() {
			continue
		}
		fmt.Fprintf(w, "\n%s: %s [%s]\n  %s\n", strings.ToUpper(s.State), s.Text, strings.Join(s.Labels, ", "), firstLines(s.Reason, 6))
	}
	_, err := fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", total.Passed, total.Failed, total.Skipped)
	return err
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n  ")
}

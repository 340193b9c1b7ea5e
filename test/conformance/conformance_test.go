//go:build conformance

package conformance

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The files the suite leaves in the report directory (report.html and
// report.yaml are its own; the others are asked for by flag).
var reportFiles = []string{"report.html", "report.yaml", "junit.xml", "report.json", "suite.log", "summary.txt"}

// TestMCSConformance runs the upstream MCS API conformance suite
// (third_party/mcs-conformance, or the directory MCS_CONFORMANCE names)
// against two clusters of real nodes
// whose agents are connected, with every label or those of
// MCS_CONFORMANCE_LABELS (a Ginkgo label filter), keeps its reports in
// FLOTILLA_CONFORMANCE_REPORT and prints the count per label. It fails
// when a spec fails.
func TestMCSConformance(t *testing.T) {
	src := os.Getenv("MCS_CONFORMANCE")
	if src == "" {
		src = filepath.Join(repoRoot(), "third_party", "mcs-conformance")
	}
	reports := reportDir()
	harness.Require(t, harness.NeedsNodes...)
	harness.Require(t, harness.DebianTools)
	start := time.Now()
	versions, err := ProjectVersions(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	suite, err := BuildSuite(src, harness.CacheDir(), versions...)
	if err != nil {
		t.Fatal(err)
	}
	images := harness.MCSSuiteImages(t)
	t.Logf("suite and its images built: %s", time.Since(start).Round(time.Second))

	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Images: []string{images},
	})
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	for _, c := range cs {
		c.ForwardClusterset(t)
	}
	for _, c := range cs {
		waitClustersetDNS(t, c)
	}
	contexts := []Context{{Name: "flotilla-a", Config: cs[0].CP.Config}, {Name: "flotilla-b", Config: cs[1].CP.Config}}
	// In the run's directory, removed with it: it holds the admins' keys.
	kubeconfig := filepath.Join(env.Dir, "conformance-kubeconfig")
	if err := WriteKubeconfig(kubeconfig, contexts); err != nil {
		t.Fatal(err)
	}

	if err := os.MkdirAll(reports, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range reportFiles {
		if err := os.Remove(filepath.Join(reports, f)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	log, err := os.Create(filepath.Join(reports, "suite.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	args := []string{
		"-test.v", "-test.timeout", "0",
		"-kubeconfig", kubeconfig, "-contexts", contexts[0].Name + "," + contexts[1].Name,
		"-ginkgo.v", "-ginkgo.no-color", "-ginkgo.junit-report", "junit.xml", "-ginkgo.json-report", "report.json",
		"-organization", "flotilla-io", "-project", "Flotilla", "-version", version(),
	}
	if f := os.Getenv("MCS_CONFORMANCE_LABELS"); f != "" {
		args = append(args, "-ginkgo.label-filter", f)
	}
	cmd := exec.Command(suite, args...)
	cmd.Dir = reports
	cmd.Stdout = io.MultiWriter(os.Stdout, log)
	cmd.Stderr = cmd.Stdout
	t.Logf("running %s %s in %s", suite, strings.Join(args, " "), reports)
	runStart := time.Now()
	runErr := cmd.Run()
	t.Logf("suite ran %s (%v)", time.Since(runStart).Round(time.Second), runErr)

	f, err := os.Open(filepath.Join(reports, "report.json"))
	if err != nil {
		t.Fatalf("the suite left no JSON report (%v): %v", runErr, err)
	}
	specs, err := ReadSpecs(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var summary bytes.Buffer
	if err := WriteSummary(&summary, specs); err != nil {
		t.Fatal(err)
	}
	os.Stdout.Write(summary.Bytes())
	if err := os.WriteFile(filepath.Join(reports, "summary.txt"), summary.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range reportFiles {
		if _, err := os.Stat(filepath.Join(reports, f)); err != nil {
			t.Errorf("report directory %s: %v", reports, err)
		}
	}
	if len(specs) == 0 {
		t.Errorf("the suite ran no spec")
	}
	for _, s := range specs {
		if !s.Passed() && !s.Skipped() {
			t.Errorf("%s: %s", s.State, s.Text)
		}
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("the suite failed with every spec passed or skipped: %v (suite.log)", runErr)
	}
}

// waitClustersetDNS waits until a pod of c resolves a clusterset.local
// name through the cluster's CoreDNS: a spec that asked before CoreDNS
// forwards the zone would fail for the test's set-up, not for Flotilla.
func waitClustersetDNS(t *testing.T, c *federation.NodeCluster) {
	t.Helper()
	ctx := context.Background()
	pods := c.CP.Client.CoreV1().Pods("default")
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "clusterset-dns-probe"},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "probe", Image: harness.NetshootImage, Command: []string{"sleep", "3600"}}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	if _, err := pods.Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatalf("cluster %s: %v", c.Name, err)
	}
	defer func() {
		if err := pods.Delete(ctx, probe.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Errorf("cluster %s: delete pod %s: %v", c.Name, probe.Name, err)
		}
	}()
	// dns-version.clusterset.local answers TXT "1.0.0" from the agent alone.
	took := eventually.Within(t, 3*time.Minute, "cluster "+c.Name+"'s pod resolves dns-version.clusterset.local through CoreDNS", func() error {
		out, err := federation.Kubectl(c.CP, "exec", probe.Name, "--", "nslookup", "-type=TXT", "dns-version.clusterset.local.")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if !strings.Contains(out, `"1.0.0"`) {
			return fmt.Errorf("answer %q, want the TXT record \"1.0.0\"", out)
		}
		return nil
	})
	t.Logf("cluster %s resolves clusterset.local through CoreDNS %s after the probe pod's creation", c.Name, took.Round(time.Second))
}

// reportDir is FLOTILLA_CONFORMANCE_REPORT, relative to the repository's
// root when not absolute; conformance-report there by default.
func reportDir() string {
	dir := os.Getenv("FLOTILLA_CONFORMANCE_REPORT")
	if dir == "" {
		dir = "conformance-report"
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(repoRoot(), dir)
	}
	return filepath.Clean(dir)
}

// repoRoot is the checkout's root directory.
func repoRoot() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(self), "..", ".."))
}

// version is the checkout's, as `make build` stamps the binary.
func version() string {
	out, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		return "dev"
	}
	return strings.TrimSpace(string(out))
}

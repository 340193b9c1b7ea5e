package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/test/harness"
)

// readTarGz reads every regular file of a gzipped tar archive.
func readTarGz(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	tr := tar.NewReader(gz)
	out := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[hdr.Name] = data
	}
}

// checkChart checks the packaged chart: the release's version, its image
// pinned, deploy/'s manifests in files/ and nothing of the repository's
// Go code.
func checkChart(t *testing.T, file, version, pinned string) {
	t.Helper()
	files := readTarGz(t, file)
	var meta struct {
		Name       string `json:"name"`
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(files["flotilla/Chart.yaml"], &meta); err != nil {
		t.Fatalf("%s: Chart.yaml: %v", file, err)
	}
	if meta.Name != "flotilla" || meta.Version != strings.TrimPrefix(version, "v") || meta.AppVersion != version {
		t.Errorf("%s: Chart.yaml names %+v, want flotilla %s, appVersion %s", file, meta, strings.TrimPrefix(version, "v"), version)
	}
	var values struct {
		Image struct{ Repository, Tag, Digest string }
	}
	if err := yaml.Unmarshal(files["flotilla/values.yaml"], &values); err != nil {
		t.Fatalf("%s: values.yaml: %v", file, err)
	}
	if got := values.Image.Repository + "@" + values.Image.Digest; got != pinned {
		t.Errorf("%s: values name the image %s, want %s", file, got, pinned)
	}
	for _, want := range []string{"flotilla/templates/deployment.yaml", "flotilla/files/deployment.yaml", "flotilla/files/kustomization.yaml",
		"flotilla/crds/multicluster.x-k8s.io_serviceexports.yaml", "flotilla/files/crds/flotilla.io_peers.yaml"} {
		if _, ok := files[want]; !ok {
			t.Errorf("%s lacks %s", file, want)
		}
	}
	for name := range files {
		if strings.HasSuffix(name, ".go") || !strings.HasPrefix(name, "flotilla/") {
			t.Errorf("%s holds %s", file, name)
		}
	}
}

// checkPlugin checks the kubectl plugin: one archive per CLI platform,
// each holding that platform's CLI as kubectl-flotilla and the license
// file's bytes as LICENSE, and krew's manifest naming each with its
// SHA-256 under the release's URL.
func checkPlugin(t *testing.T, dir, version, license string) {
	t.Helper()
	licenseText, err := os.ReadFile(license)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, krewFile))
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(raw, &p); err != nil {
		t.Fatalf("%s: %v", krewFile, err)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "flotilla" || p.Spec.Version != version || p.Spec.ShortDescription == "" {
		t.Errorf("%s: %s %s %q version %q", krewFile, p.APIVersion, p.Kind, p.Metadata.Name, p.Spec.Version)
	}
	var platforms []string
	for _, kp := range p.Spec.Platforms {
		platform := kp.Selector.MatchLabels["os"] + "/" + kp.Selector.MatchLabels["arch"]
		platforms = append(platforms, platform)
		archive := pluginArchive(platform)
		if want := strings.ReplaceAll(downloadURL, "VERSION", version) + "/" + archive; kp.URI != want {
			t.Errorf("%s: %s from %s, want %s", krewFile, platform, kp.URI, want)
		}
		if sum, err := sha256File(filepath.Join(dir, archive)); err != nil || sum != kp.SHA256 {
			t.Errorf("%s: %s has SHA-256 %s (%v), the manifest says %s", krewFile, archive, sum, err, kp.SHA256)
		}
		if want := []pluginFile{{pluginBinary, "."}, {pluginLicense, "."}}; kp.Bin != pluginBinary || !slices.Equal(kp.Files, want) {
			t.Errorf("%s: %s installs %q from %+v, want %s from %+v", krewFile, platform, kp.Bin, kp.Files, pluginBinary, want)
		}
		files := readTarGz(t, filepath.Join(dir, archive))
		bin, err := os.ReadFile(filepath.Join(dir, binaryName(platform)))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) != 2 || !bytes.Equal(files[pluginBinary], bin) || !bytes.Equal(files[pluginLicense], licenseText) {
			t.Errorf("%s holds %d files, want only %s, the bytes of %s, and %s, those of %s", archive, len(files), pluginBinary, binaryName(platform), pluginLicense, license)
		}
	}
	slices.Sort(platforms)
	if want := slices.Sorted(slices.Values(binaryPlatforms)); !slices.Equal(platforms, want) {
		t.Errorf("%s: platforms %v, want %v", krewFile, platforms, want)
	}
}

// helmImage is an image a rendered manifest names.
var helmImage = regexp.MustCompile(`(?m)^\s*-?\s*image:\s*"?([^"\s]+)"?\s*$`)

// Helm itself reads the released chart: lint passes, and every container
// it renders runs the image pinned by digest.
func checkChartWithHelm(t *testing.T, file, pinned string) {
	harness.Require(t, harness.Helm)
	home := t.TempDir()
	helm := func(args ...string) string {
		cmd := exec.Command(harness.HelmBinary(), args...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := helm("lint", file); !strings.Contains(out, "0 chart(s) failed") {
		t.Errorf("helm lint %s:\n%s", file, out)
	}
	rendered := helm("template", "flotilla", file, "--namespace", "flotilla-system")
	found := helmImage.FindAllStringSubmatch(rendered, -1)
	if len(found) == 0 {
		t.Fatalf("helm template %s names no image", file)
	}
	for _, m := range found {
		if m[1] != pinned {
			t.Errorf("helm template %s runs %s, want only %s", file, m[1], pinned)
		}
	}
}

// A chart whose values or Chart.yaml no longer read as the release
// expects is refused, not released naming the default image.
func TestChartEditsRefuseAChangedLine(t *testing.T) {
	for _, tc := range []struct{ data, old string }{
		{"image:\n  repository: other.example/flotilla\n", "  repository: " + deployImage},
		{"version: 0.0.0\nversion: 0.0.0\n", "version: 0.0.0"},
	} {
		if _, err := replaceLine([]byte(tc.data), tc.old, "x"); err == nil {
			t.Errorf("replaceLine of %q in %q: no error", tc.old, tc.data)
		}
	}
	got, err := replaceLine([]byte("a\n  digest: \"\"\nb\n"), `  digest: ""`, "  digest: sha256:1")
	if err != nil || string(got) != "a\n  digest: sha256:1\nb\n" {
		t.Errorf("replaceLine: %q, %v", got, err)
	}
}

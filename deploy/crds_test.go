package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	mcscrd "sigs.k8s.io/mcs-api/config/crd"
)

// controllerGen is the generator `make generate` uses; keep the two equal.
const controllerGen = "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.19.0"

// The CRDs in deploy/crds are what controller-gen makes of the types in
// api/ today: nobody edited the YAML by hand or forgot `make generate`.
func TestCRDsMatchAPITypes(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH to run controller-gen: %v", err)
	}
	out := t.TempDir()
	cmd := exec.Command(goBin, "run", controllerGen, "crd", "paths=./api/...", "output:crd:artifacts:config="+out)
	cmd.Dir = ".." // the module root
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run %s: %v\n%s\ncontroller-gen could not be fetched or built. It needs the Go module proxy "+
			"(GOPROXY, default https://proxy.golang.org), or offline a module cache that holds it: run "+
			"`go run %s --version` once while connected, then test with GOPROXY=file://$(go env GOMODCACHE)/cache/download "+
			"(GOPROXY=off fails even with the cache)", controllerGen, err, bytes.TrimSpace(msg), controllerGen)
	}

	generated := yamlFiles(t, out)
	committed := slices.DeleteFunc(yamlFiles(t, "crds"), func(n string) bool { return upstreamCRDs[n] != nil })
	if !slices.Equal(generated, committed) {
		t.Fatalf("controller-gen makes %v, deploy/crds holds %v; run `make generate`", generated, committed)
	}
	for _, name := range generated {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("crds", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/crds/%s differs from what api/ generates (%s); run `make generate`", name, firstDifference(got, want))
		}
	}
}

// upstreamCRDs are the CRDs of the Multi-Cluster Services API, shipped as
// its module embeds them, not generated from api/.
var upstreamCRDs = map[string][]byte{
	"multicluster.x-k8s.io_serviceexports.yaml": mcscrd.ServiceExportCRD,
	"multicluster.x-k8s.io_serviceimports.yaml": mcscrd.ServiceImportCRD,
}

// The MCS CRDs in deploy/crds are the module's in go.mod, byte for byte:
// upgrading sigs.k8s.io/mcs-api means copying them again.
func TestUpstreamCRDsMatchModule(t *testing.T) {
	for name, want := range upstreamCRDs {
		got, err := os.ReadFile(filepath.Join("crds", name))
		if err != nil {
			t.Fatalf("%v: copy it from the module sigs.k8s.io/mcs-api (config/crd)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/crds/%s differs from the module's (%s); copy it again from sigs.k8s.io/mcs-api config/crd", name, firstDifference(got, want))
		}
	}
}

func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
	}
	slices.Sort(names)
	return names
}

// firstDifference names the first line where committed and generated part.
func firstDifference(committed, generated []byte) string {
	c := strings.Split(string(committed), "\n")
	g := strings.Split(string(generated), "\n")
	for i := range max(len(c), len(g)) {
		var cl, gl string
		if i < len(c) {
			cl = c[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if cl != gl {
			return fmt.Sprintf("line %d: committed %q, generated %q", i+1, cl, gl)
		}
	}
	return "same lines, different bytes"
}

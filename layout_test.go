package flotilla_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// The folders below the Kubernetes side know nothing of Kubernetes: the
// negotiation, the data path (tunnel and fabric), the ledger, discovery,
// identity, the grant message and the traffic policy import no k8s.io or
// sigs.k8s.io package, directly or through another.
func TestLowerLayersImportNoKubernetes(t *testing.T) {
	for _, pkg := range []string{"./identity", "./discovery", "./ipam", "./tunnel", "./fabric", "./peering", "./offload/grant", "./policy", "./observe/trace"} {
		t.Run(strings.TrimPrefix(pkg, "./"), func(t *testing.T) {
			// One line per package that imports Kubernetes itself.
			reported := map[string]bool{}
			for _, chain := range kubernetesImports(t, pkg) {
				importer := chain[len(chain)-2]
				if !reported[importer] {
					reported[importer] = true
					t.Errorf("%s imports Kubernetes: %s", pkg, strings.Join(chain, " -> "))
				}
			}
		})
	}
}

// kubernetesImports returns, for every Kubernetes package pkg depends on,
// one chain of imports from pkg to it.
func kubernetesImports(t *testing.T, pkg string) [][]string {
	t.Helper()
	imports, root := listImports(t, pkg)
	// Breadth first from pkg, remembering how each package was reached.
	via := map[string]string{root: ""}
	queue := []string{root}
	var chains [][]string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "sigs.k8s.io/") {
			var chain []string
			for q := p; q != ""; q = via[q] {
				chain = append([]string{q}, chain...)
			}
			chains = append(chains, chain)
			continue // one chain per package reached first is enough
		}
		for _, i := range imports[p] {
			if _, seen := via[i]; !seen {
				via[i] = p
				queue = append(queue, i)
			}
		}
	}
	return chains
}

// Offloading is a root and feature packages above it: a feature imports
// the root, the consumer's remote session and the shared foundations,
// never another feature (mirror alone asks tenancy for the namespaces it
// makes). Each package below may import, of this module, only what its
// row lists.
func TestOffloadFeaturesImportOnlyTheirFoundations(t *testing.T) {
	base := []string{"api/", "identity", "internal/ctrl", "internal/kubeclient", "offload/grant"}
	allowed := map[string][]string{
		"offload":                {"api/", "identity", "offload/grant"},
		"offload/grant":          {"identity", "ipam"},
		"offload/internal/certs": {"api/", "internal/kubeclient"},
		"offload/remote":         append([]string{"offload"}, base...),
		"offload/tenancy":        append([]string{"offload", "peering"}, base...),
		"offload/mirror":         append([]string{"offload", "offload/remote", "offload/tenancy"}, base...),
		"offload/vnode":          append([]string{"offload", "offload/remote"}, base...),
		"offload/kubeletapi":     append([]string{"offload", "offload/remote", "offload/internal/certs", "internal/apiauth"}, base...),
		"offload/placement":      append([]string{"offload", "offload/internal/certs"}, base...),
		"offload/podsync":        append([]string{"offload", "offload/remote"}, base...),
		"offload/reflection":     append([]string{"offload", "offload/remote", "internal/apiauth"}, base...),
		"offload/mcs":            append([]string{"offload", "peering"}, base...),
		"offload/mcsdns":         append([]string{"offload/mcs", "internal/sourcerate"}, base...),
		"offload/dnsforward":     base,
	}
	const module = "github.com/flotilla-io/flotilla/"
	seen := map[string]bool{}
	for _, p := range goList(t, "./offload/...") {
		pkg := strings.TrimPrefix(p.ImportPath, module)
		if strings.HasPrefix(pkg, "offload/internal/offload") {
			continue // test fixtures: they assemble features on purpose
		}
		seen[pkg] = true
		rules, ok := allowed[pkg]
		if !ok {
			t.Errorf("%s: a package with no row here; say what it may import", pkg)
			continue
		}
		for _, imp := range p.Imports {
			dep, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			ok := false
			for _, r := range rules {
				if dep == r || (strings.HasSuffix(r, "/") && strings.HasPrefix(dep, r)) {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s imports %s, which its row does not allow", pkg, dep)
			}
		}
	}
	for pkg := range allowed {
		if !seen[pkg] {
			t.Errorf("%s: a row for a package that does not exist", pkg)
		}
	}
}

// The CLI builds for macOS: none of its packages there links the data
// path (tunnel, fabric, nftables), which builds for Linux only.
func TestDarwinCLILinksNoDataPath(t *testing.T) {
	for _, arch := range []string{"arm64", "amd64"} {
		cmd := exec.Command("go", "list", "-deps", "./cmd/flotilla")
		cmd.Env = append(cmd.Environ(), "GOOS=darwin", "GOARCH="+arch)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list for darwin/%s: %v", arch, err)
		}
		for _, pkg := range strings.Fields(string(out)) {
			if strings.HasPrefix(pkg, "github.com/google/nftables") || pkg == "github.com/flotilla-io/flotilla/tunnel" || pkg == "github.com/flotilla-io/flotilla/fabric" {
				t.Errorf("darwin/%s: cmd/flotilla links %s", arch, pkg)
			}
		}
	}
}

// The binary links client-go's typed clients of only the API groups it
// uses (internal/kubeclient): no package of ours in it imports the full
// clientset or an informer factory, each of which links every API group
// Kubernetes serves.
func TestBinaryImportsNoFullClientset(t *testing.T) {
	const module = "github.com/flotilla-io/flotilla/"
	imports, _ := listImports(t, "./cmd/flotilla")
	for pkg, deps := range imports {
		if !strings.HasPrefix(pkg, module) {
			continue
		}
		for _, dep := range deps {
			if dep == "k8s.io/client-go/kubernetes" || dep == "k8s.io/client-go/informers" || dep == "k8s.io/client-go/dynamic/dynamicinformer" ||
				strings.HasPrefix(dep, "k8s.io/client-go/informers/") {
				t.Errorf("%s imports %s, which links every API group; use internal/kubeclient", strings.TrimPrefix(pkg, module), dep)
			}
		}
	}
}

// listImports is what each package pkg depends on imports, by go list,
// and pkg's import path.
func listImports(t *testing.T, pkg string) (imports map[string][]string, root string) {
	t.Helper()
	imports = map[string][]string{}
	for _, p := range goList(t, "-deps", pkg) {
		imports[p.ImportPath] = p.Imports
		root = p.ImportPath // -deps lists pkg last
	}
	return imports, root
}

// listedPackage is one package as `go list -json=ImportPath,Imports`
// prints it.
type listedPackage struct {
	ImportPath string
	Imports    []string
}

// goList runs `go list -json=ImportPath,Imports args...` and returns the
// packages in the order it lists them.
func goList(t *testing.T, args ...string) []listedPackage {
	t.Helper()
	argv := append([]string{"list", "-json=ImportPath,Imports"}, args...)
	out, err := exec.Command("go", argv...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(argv, " "), err, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(argv, " "), err)
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatalf("go %s: %v", strings.Join(argv, " "), err)
		}
		pkgs = append(pkgs, p)
	}
}

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// quickstartImage is the image docs/quickstart.md runs; the test nodes
// have the test server under its name, which serves HTTP on 8080 too.
const quickstartImage = "docker.io/nginxinc/nginx-unprivileged:1.27"

func readQuickstart(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "quickstart.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "image: "+quickstartImage+"\n") {
		t.Fatalf("docs/quickstart.md does not run %s, the image the test nodes have under that name: change quickstartImage", quickstartImage)
	}
	return string(doc)
}

var shellBlock = regexp.MustCompile("(?ms)^```sh\n(.*?)^```\n")

// quickstartScript returns the shell blocks of doc in order, as two
// scripts: the steps, and those under "## Undo". The install block is
// left out: the test clusters were installed from deploy/ with the
// settings a test machine needs.
func quickstartScript(t *testing.T, doc string) (steps, undo string) {
	t.Helper()
	main, undoPart, ok := strings.Cut(doc, "\n## Undo\n")
	if !ok {
		t.Fatal(`docs/quickstart.md has no section "## Undo"`)
	}
	blocks := func(part string) []string {
		var out []string
		for _, m := range shellBlock.FindAllStringSubmatch(part, -1) {
			out = append(out, m[1])
		}
		return out
	}
	var installs, verifies int
	var kept []string
	for _, b := range blocks(main) {
		switch {
		case strings.Contains(b, "apply --server-side -f flotilla.yaml"):
			installs++
			continue
		case strings.HasPrefix(b, "flotilla verify "):
			verifies++
		}
		kept = append(kept, b)
	}
	if installs != 1 || verifies != 1 || len(kept) < 5 {
		t.Fatalf("docs/quickstart.md: %d install blocks, %d verify blocks and %d more; want one each and the steps between", installs, verifies, len(kept))
	}
	u := blocks(undoPart)
	if len(u) == 0 {
		t.Fatal("docs/quickstart.md: no shell block under Undo")
	}
	return strings.Join(kept, ""), strings.Join(u, "")
}

// quickstart runs the quickstart's scripts as a user would: one
// kubeconfig with a context per cluster (A and B), kubectl and flotilla
// on PATH, and each script in bash -euo pipefail; a later script sees the
// variables an earlier one set.
type quickstart struct {
	env   []string
	dir   string // the scripts' working directory, for the files they write
	state string
}

// contextNames are the kubeconfig contexts the quickstart names A and B.
var contextNames = regexp.MustCompile(`(?m)^export A=(\S+) B=(\S+)`)

// newQuickstart gives a and b the contexts the quickstart's export line
// names A and B, so that nothing in it is changed.
func newQuickstart(t *testing.T, doc string, a, b *federation.NodeCluster) *quickstart {
	t.Helper()
	m := contextNames.FindStringSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/quickstart.md has no line %q", contextNames)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(harness.Flotilla(t), filepath.Join(bin, "flotilla")); err != nil {
		t.Fatal(err)
	}
	kubeconfig := contextsKubeconfig(t, dir, map[string]*federation.NodeCluster{m[1]: a, m[2]: b})
	return &quickstart{
		env: append(os.Environ(), "KUBECONFIG="+kubeconfig,
			"PATH="+bin+string(os.PathListSeparator)+harness.KubeBinDir()+string(os.PathListSeparator)+os.Getenv("PATH")),
		dir:   dir,
		state: filepath.Join(dir, "state.sh"),
	}
}

func (q *quickstart) run(t *testing.T, script string) (string, error) {
	t.Helper()
	// set -a exports what the script sets, so export -p hands it on.
	full := "set -a\n[ -f " + q.state + " ] && . " + q.state + "\nset -x\n" + script + "set +x\nexport -p > " + q.state + "\n"
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", full)
	cmd.Env, cmd.Dir = q.env, q.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// contextsKubeconfig writes one kubeconfig with a context of each
// cluster, by name, and none current.
func contextsKubeconfig(t *testing.T, dir string, cs map[string]*federation.NodeCluster) string {
	t.Helper()
	merged := clientcmdapi.NewConfig()
	for name, c := range cs {
		cfg, err := clientcmd.LoadFromFile(c.CP.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cur := cfg.Contexts[cfg.CurrentContext]
		if cur == nil {
			t.Fatalf("%s: no current context", c.CP.Kubeconfig)
		}
		merged.Clusters[name] = cfg.Clusters[cur.Cluster]
		merged.AuthInfos[name] = cfg.AuthInfos[cur.AuthInfo]
		merged.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*merged, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// The quickstart's blocks parse as the test runs them.
func TestQuickstartBlocks(t *testing.T) {
	doc := readQuickstart(t)
	steps, undo := quickstartScript(t, doc)
	if !strings.Contains(steps, "flotilla verify") {
		t.Errorf("the steps do not run flotilla verify:\n%s", steps)
	}
	for _, want := range []string{"flotilla join --context \"$B\" --remote-context \"$A\"", "flotilla offload namespace shop", "kind: ServiceExport"} {
		if !strings.Contains(steps, want) {
			t.Errorf("the steps lack %q:\n%s", want, steps)
		}
	}
	if contextNames.FindString(steps) == "" || strings.Contains(steps, "flotilla.yaml") || !strings.Contains(undo, "flotilla revoke") {
		t.Errorf("steps:\n%s\nundo:\n%s", steps, undo)
	}
	for _, script := range []string{steps, undo} {
		if out, err := exec.Command("bash", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("bash -n: %v\n%s\n%s", err, out, script)
		}
	}
}

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/agent/agentapi"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/ipam"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// testGather writes the support bundle of consumer a (into a directory)
// and of provider b (a .tar.gz) and greps both for every token and key
// either cluster holds: the agents' ServiceAccount tokens as their pods
// hold them, the federation key, the WireGuard private keys and the
// identity seeds in the ledgers, the join tokens, the grant's credential
// a holds from b, and every value of every Secret in the agents'
// namespaces but certificates (public). The bundles first show they hold what they should.
func testGather(t *testing.T, env *harness.Env, a, b *federation.NodeCluster, bID string) {
	t.Run("flotilla gather's bundles hold no token or key of either cluster", func(t *testing.T) {
		dir := t.TempDir()
		bundles := map[string]map[string][]byte{
			a.Name: gatherFiles(t, a, filepath.Join(dir, "a")),
			b.Name: gatherFiles(t, b, filepath.Join(dir, "b.tar.gz")),
		}
		// The witness that they hold what a reader needs: the agent's
		// log, its metrics, the Peer of the other, and events.
		for name, files := range bundles {
			for _, want := range []string{"info.txt", "peers.yaml", "grants.yaml", "namespaceoffloads.yaml", "trace.yaml", "objects/secret-names.txt", "events/" + federation.AgentNamespace + ".txt"} {
				if _, ok := files[want]; !ok {
					t.Errorf("%s's bundle has no %s; it has %v", name, want, keys(files))
				}
			}
			if !anyFile(files, "agent/", "/metrics.txt", "flotilla_build_info") || !anyFile(files, "agent/", ".log", "") || !anyFile(files, "fabric/", ".log", "") {
				t.Errorf("%s's bundle lacks the agent's metrics or the agent's and the fabric's logs: %v", name, keys(files))
			}
		}
		if !strings.Contains(string(bundles[a.Name]["peers.yaml"]), bID) {
			t.Errorf("a's peers.yaml does not name b (%s)", bID)
		}
		secrets := map[string][]byte{}
		for _, c := range []*federation.NodeCluster{a, b} {
			heldSecrets(t, env, c, secrets)
		}
		secrets["the credential a holds of b's grant"] = []byte(heldCredential(t, a, bID).Token.Reveal())
		if len(secrets) < 10 {
			t.Fatalf("only %d secrets found to look for: %v", len(secrets), keys(secrets))
		}
		for bundle, files := range bundles {
			for file, data := range files {
				for what, secret := range secrets {
					for _, form := range forms(secret) {
						if bytes.Contains(data, form) {
							t.Errorf("%s's bundle: %s holds %s", bundle, file, what)
						}
					}
				}
			}
		}
		t.Logf("looked for %d secrets in %d + %d files", len(secrets), len(bundles[a.Name]), len(bundles[b.Name]))
	})
}

// gatherFiles runs flotilla gather on c into to and returns the bundle's
// files by their names in it.
func gatherFiles(t *testing.T, c *federation.NodeCluster, to string) map[string][]byte {
	t.Helper()
	cmd := exec.Command(harness.Flotilla(t), "gather", "--kubeconfig", c.CP.Kubeconfig, "-o", to)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("flotilla gather on %s: %v\n%s%s", c.Name, err, out, stderr.String())
	if err != nil || strings.TrimSpace(string(out)) != to || !strings.Contains(stderr.String(), "gather: logs and metrics") {
		t.Fatalf("flotilla gather on %s: %v; want the bundle's name on stdout and progress on stderr", c.Name, err)
	}
	files := map[string][]byte{}
	if !strings.HasSuffix(to, ".tar.gz") {
		err := filepath.WalkDir(to, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(p)
			rel, _ := filepath.Rel(to, p)
			files[filepath.ToSlash(rel)] = data
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	f, err := os.Open(to)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		_, name, _ := strings.Cut(h.Name, "/")
		files[name] = data
	}
}

// heldSecrets adds what c holds that no bundle may show, by what it is.
func heldSecrets(t *testing.T, env *harness.Env, c *federation.NodeCluster, into map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	l, err := ipam.OpenSnapshot(filepath.Join(c.StateDir, ipam.FileName))
	if err != nil {
		t.Fatalf("%s's ledger: %v", c.Name, err)
	}
	defer l.Close()
	for _, name := range []string{"wireguard", "identity"} {
		k, err := l.Key(name)
		if err != nil {
			t.Fatalf("%s's %s key: %v", c.Name, name, err)
		}
		into[c.Name+"'s "+name+" key"] = k
	}
	ring, err := l.Key(agentapi.LedgerKeyring)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := discovery.DecodeKeyring(ring)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		into[c.Name+"'s federation key "+string(rune('0'+i))] = k
	}
	secrets, err := c.CP.Client.CoreV1().Secrets(federation.AgentNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		for k, v := range s.Data {
			// Certificates are public: the cluster's CA is in every
			// namespace's kube-root-ca.crt.
			if len(v) >= 16 && !bytes.HasPrefix(bytes.TrimSpace(v), []byte("-----BEGIN CERTIFICATE-----")) {
				into[c.Name+"'s Secret "+s.Name+" "+k] = v
			}
		}
	}
	pod, err := c.AgentPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tokens, _ := filepath.Glob(filepath.Join(env.Dir, "*", "nodes", "*", "kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "*", "token"))
	if len(tokens) == 0 {
		t.Fatalf("no ServiceAccount token of %s's agent pod %s under %s", c.Name, pod.Name, env.Dir)
	}
	for _, p := range tokens {
		tok, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		into[c.Name+"'s agent ServiceAccount token"] = tok
	}
}

// forms are the ways a secret could appear in text: as it is (when it
// is text), in base64 and in hex.
func forms(secret []byte) [][]byte {
	out := [][]byte{[]byte(base64.StdEncoding.EncodeToString(secret)), []byte(base64.RawURLEncoding.EncodeToString(secret)), []byte(hex.EncodeToString(secret))}
	if s := strings.TrimSpace(string(secret)); len(s) >= 16 {
		out = append(out, []byte(s))
	}
	return out
}

func anyFile(files map[string][]byte, prefix, suffix, content string) bool {
	for name, data := range files {
		if strings.HasPrefix(name, prefix) && strings.HasSuffix(name, suffix) && len(data) > 0 && bytes.Contains(data, []byte(content)) {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

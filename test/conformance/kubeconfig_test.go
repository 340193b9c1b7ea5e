package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The kubeconfig holds each cluster under its own context, cluster and
// user name, with its own key, readable by its owner only.
func TestWriteKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := func(host, key string) *rest.Config {
		return &rest.Config{Host: host, TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca-" + key), CertData: []byte("cert-" + key), KeyData: []byte("key-" + key)}}
	}
	if err := WriteKubeconfig(path, []Context{{Name: "flotilla-a", Config: cfg("https://127.0.0.1:1", "a")}, {Name: "flotilla-b", Config: cfg("https://127.0.0.1:2", "b")}}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	got, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.CurrentContext != "flotilla-a" {
		t.Errorf("current context %q, want the first", got.CurrentContext)
	}
	for _, c := range []struct{ name, host, key string }{{"flotilla-a", "https://127.0.0.1:1", "a"}, {"flotilla-b", "https://127.0.0.1:2", "b"}} {
		ctx := got.Contexts[c.name]
		if ctx == nil || ctx.Cluster != c.name || ctx.AuthInfo != c.name {
			t.Fatalf("context %s: %+v, want cluster and user of its name", c.name, ctx)
		}
		if s := got.Clusters[c.name].Server; s != c.host {
			t.Errorf("cluster %s server %s, want %s", c.name, s, c.host)
		}
		if k := string(got.AuthInfos[c.name].ClientKeyData); k != "key-"+c.key {
			t.Errorf("user %s holds key %q, want its own", c.name, k)
		}
	}
}

func TestWriteKubeconfigRefusesSharedNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	err := WriteKubeconfig(path, []Context{{Name: "c", Config: &rest.Config{}}, {Name: "c", Config: &rest.Config{}}})
	if err == nil || !strings.Contains(err.Error(), "distinct") {
		t.Errorf("error %v, want one asking for distinct names", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a kubeconfig was written: %v", err)
	}
}

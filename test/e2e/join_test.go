package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/flotilla-io/flotilla/agent"
	"github.com/flotilla-io/flotilla/discovery"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestQuickstart follows docs/quickstart.md (quickstartScript) with A
// and B being two clusters of real nodes: a runs with --peering=manual,
// and b is installed from deploy/ without any federation key. Before the
// quickstart's join it checks that a join changes b only with the user's
// rights on both API servers: a user who may not read a's token is
// refused and b is untouched; a join while a's agent is down is undone
// and leaves b exactly as before; a's --peering=manual stops a join
// without --accept with what to accept. The quickstart's join, with
// --accept, finishes it: Connected both ways, and pods talk by their
// views; its offloaded Deployment runs on a, behind an exported Service.
func TestQuickstart(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	doc := readQuickstart(t)
	start := time.Now()
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Keyless: []int{1},
		ArgsFor: func(i int) []string {
			if i == 0 {
				return []string{"--peering=manual"}
			}
			return nil
		},
		Images: []string{harness.TestServerImageAs(t, quickstartImage)},
	})
	installed := time.Since(start)
	a, b := cs[0], cs[1]
	ctx := t.Context()
	ns := federation.AgentNamespace

	// The witness that b runs alone: its agent published a token of a
	// key of its own, and it has no Secret flotilla-federation.
	aKey := publishedKey(t, a)
	bKey := publishedKey(t, b)
	if discovery.Fingerprint(aKey) == discovery.Fingerprint(bKey) {
		t.Fatalf("b holds a's key before any join")
	}
	before := snapshot(t, b)
	if before.federationSecret {
		t.Fatalf("keyless b has a Secret %s", agent.FederationSecret)
	}

	t.Run("a user who may not read a's token changes nothing on b", func(t *testing.T) {
		viewer := roleKubeconfig(t, a, "joiner", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}})
		// Its rights are in force: it reads a ConfigMap of the namespace.
		eventually.Within(t, time.Minute, "the joiner reads ConfigMaps on a", func() error {
			_, err := kubectlAs(viewer, "-n", ns, "get", "configmap", agent.FederationKeysStatus)
			return err
		})
		out, err := joinCLI(t, "join", "--kubeconfig", b.CP.Kubeconfig, "--remote-kubeconfig", viewer, "--wait", "1m")
		if err == nil || !strings.Contains(out, "cannot read") || !strings.Contains(out, "join token") || !strings.Contains(out, "ask an admin of that cluster") {
			t.Errorf("join with a's account that may not read Secrets: %v\n%s; want a refusal that says what to ask for", err, out)
		}
		t.Logf("refused: %s", strings.TrimSpace(out))
		if now := snapshot(t, b); !now.equal(before) {
			t.Errorf("b changed: %+v, was %+v", now, before)
		}
	})

	t.Run("a join while a's agent is down is undone", func(t *testing.T) {
		mustKubectl(t, a.CP, "-n", ns, "scale", "deployment/flotilla-agent", "--replicas=0")
		eventually.Within(t, time.Minute, "a's agent pod gone", func() error {
			pods, err := a.CP.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: federation.AgentSelector})
			if err != nil || len(pods.Items) > 0 {
				return fmt.Errorf("%d agent pods, err %v", len(pods.Items), err)
			}
			return nil
		})
		out, err := joinCLI(t, "join", "--kubeconfig", b.CP.Kubeconfig, "--remote-kubeconfig", a.CP.Kubeconfig, "--wait", "45s")
		t.Logf("flotilla join:\n%s", out)
		// The witness that it got as far as it could: b's agent held a's key.
		if !strings.Contains(out, "b's agent holds key "+discovery.Fingerprint(aKey)) {
			t.Fatalf("join to a down a: %v; want b's agent to take a's key first", err)
		}
		if err == nil || !strings.Contains(out, "do not see each other") || !strings.Contains(out, "b is as it was") {
			t.Errorf("join to a down a: %v; want it to fail, say why and undo", err)
		}
		if now := snapshot(t, b); !now.equal(before) {
			t.Errorf("b after the undone join: %+v, was %+v", now, before)
		}
		mustKubectl(t, a.CP, "-n", ns, "scale", "deployment/flotilla-agent", "--replicas=1")
		eventually.Within(t, 2*time.Minute, "a's agent back", func() error {
			_, err := a.AgentPod(ctx)
			return err
		})
	})

	t.Run("a's manual peering stops the join with what to accept", func(t *testing.T) {
		out, err := joinCLI(t, "join", "--kubeconfig", b.CP.Kubeconfig, "--remote-kubeconfig", a.CP.Kubeconfig, "--wait", "2m")
		t.Logf("flotilla join:\n%s", out)
		if err == nil || !strings.Contains(out, "peers see each other") || !strings.Contains(out, "waits for an admin") ||
			!strings.Contains(out, "on a, `flotilla peer accept") || strings.Contains(out, "on b,") {
			t.Errorf("join to a manual a: %v; want it to stop saying a's admin must accept b", err)
		}
		if now := snapshot(t, b); !now.federationSecret {
			t.Errorf("b's Secret %s is gone: a join awaiting acceptance is not undone", agent.FederationSecret)
		}
	})

	t.Run("the quickstart, with --accept, finishes it", func(t *testing.T) {
		steps, undo := quickstartScript(t, doc)
		q := newQuickstart(t, doc, a, b)
		stepsStart := time.Now()
		out, err := q.run(t, steps)
		stepsTook := time.Since(stepsStart)
		t.Logf("docs/quickstart.md, but for the undo:\n%s", out)
		if err != nil {
			t.Fatalf("docs/quickstart.md: %v", err)
		}
		if !strings.Contains(out, "b already holds a's federation key") || !strings.Contains(out, "a accepts b") ||
			!strings.Contains(out, "Connected both ways: b and a") {
			t.Errorf("the quickstart's join --accept: want it to accept and end Connected")
		}
		for _, pair := range [][2]*federation.NodeCluster{{a, b}, {b, a}} {
			if r := federation.Fetch(t, pair[0], pair[1]); r.Err != nil {
				t.Errorf("%s -> %s (%s): %v", pair[0].Name, pair[1].Name, r.Dst, r.Err)
			}
		}
		if tok := strings.TrimSpace(mustFlotillaCLI(t, "token", "--kubeconfig", b.CP.Kubeconfig)); tokenKey(t, tok) != discovery.Fingerprint(aKey) {
			t.Errorf("b publishes a token of key %s, want a's %s", tokenKey(t, tok), discovery.Fingerprint(aKey))
		}
		waitPods(t, b, "shop", "app=web", 1, time.Minute, runningOn(offload.VirtualNodeName(peerID(t, b, a.Name))))
		t.Logf("time from two bare clusters to the quickstart's last step: %s (clusters of real nodes up and agents installed %s, the quickstart's steps %s)",
			(installed + stepsTook).Round(time.Second), installed.Round(time.Second), stepsTook.Round(time.Second))

		out, err = q.run(t, undo)
		t.Logf("docs/quickstart.md, its undo:\n%s", out)
		if err != nil {
			t.Fatalf("docs/quickstart.md's undo: %v", err)
		}
	})
}

// clusterState is what a join may change on a cluster and must put back.
type clusterState struct {
	federationSecret bool
	deployment       string // the Deployment's spec, as JSON
	keys             string // what the agent says it holds
	published        string // the fingerprint of the key it publishes
}

func (s clusterState) equal(o clusterState) bool { return s == o }

func snapshot(t *testing.T, c *federation.NodeCluster) clusterState {
	t.Helper()
	ctx := t.Context()
	ns := federation.AgentNamespace
	var s clusterState
	_, err := c.CP.Client.CoreV1().Secrets(ns).Get(ctx, agent.FederationSecret, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	s.federationSecret = err == nil
	d, err := c.CP.Client.AppsV1().Deployments(ns).Get(ctx, "flotilla-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(d.Spec)
	s.deployment = string(spec)
	cm, err := c.CP.Client.CoreV1().ConfigMaps(ns).Get(ctx, agent.FederationKeysStatus, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.keys = cm.Data[agent.StatusKeys]
	s.published = discovery.Fingerprint(publishedKey(t, c))
	return s
}

// publishedKey is the key of the join token c's agent publishes, once it
// has.
func publishedKey(t *testing.T, c *federation.NodeCluster) []byte {
	t.Helper()
	var key []byte
	eventually.Within(t, time.Minute, c.Name+"'s agent publishes its join token", func() error {
		s, err := c.CP.Client.CoreV1().Secrets(federation.AgentNamespace).Get(t.Context(), agent.JoinSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		tok, err := discovery.ParseFederationKey(string(s.Data[agent.SecretToken]))
		if err != nil {
			return err
		}
		if s.Annotations[agent.AnnotationClusterName] != c.Name || len(tok.Seeds) != 1 || !strings.HasPrefix(tok.Seeds[0], c.Gateway.Addr.String()+":") {
			return fmt.Errorf("published %v with seeds %v, want cluster %s and its gateway's address", s.Annotations, tok.Seeds, c.Name)
		}
		key = tok.Key
		return nil
	})
	return key
}

func tokenKey(t *testing.T, tok string) string {
	t.Helper()
	k, err := discovery.ParseFederationKey(tok)
	if err != nil {
		t.Fatalf("token %q: %v", tok, err)
	}
	return discovery.Fingerprint(k.Key)
}

// roleKubeconfig makes ServiceAccount name in c's agent namespace with
// rules there and returns a kubeconfig holding a token of it.
func roleKubeconfig(t *testing.T, c *federation.NodeCluster, name string, rules ...rbacv1.PolicyRule) string {
	t.Helper()
	ctx := t.Context()
	ns := federation.AgentNamespace
	core, rbac := c.CP.Client.CoreV1(), c.CP.Client.RbacV1()
	if _, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := core.ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.CP.Config.Host, CertificateAuthorityData: c.CP.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: name}
	cfg.CurrentContext = c.Name
	path := filepath.Join(t.TempDir(), c.Name+"-"+name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func kubectlAs(kubeconfig string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, federation.KubectlPath(), append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return string(out), err
}

// joinCLI runs the built binary and returns its output, both streams.
func joinCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(harness.Flotilla(t), args...).CombinedOutput()
	return string(out), err
}

func mustFlotillaCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(harness.Flotilla(t), args...).Output()
	if err != nil {
		t.Fatalf("flotilla %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

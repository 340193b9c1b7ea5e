package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestMain lets the test binary stand in for the built one: called by
// one of the binary's names (the tests of the kubectl plugin and of
// completion link it under them), it is the command.
func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case "flotilla", "kubectl-flotilla", "kubectl_complete-flotilla":
		main()
	}
	os.Exit(m.Run())
}

// clusterClient is the client of the cluster a kubeconfig's current
// context names, as the commands make it.
func clusterClient(kubeconfig string) (client.WithWatch, error) {
	return clusterRef{kubeconfig: kubeconfig}.client()
}

// peerEnv is a real API server with Flotilla's CRDs and Peers the test
// writes as the agent would.
type peerEnv struct {
	cp    *harness.ControlPlane
	admin client.Client
}

func newPeerEnv(t *testing.T) *peerEnv {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("peers", harness.ControlPlaneOptions{})
	if err := harness.ApplyCRDs(t.Context(), cp.Config, deploy.CRDs, "crds/flotilla.io_peers.yaml"); err != nil {
		t.Fatal(err)
	}
	admin, err := clusterClient(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return &peerEnv{cp: cp, admin: admin}
}

// addPeer creates a Peer as the agent does: named after the cluster ID,
// with a status.
func (e *peerEnv) addPeer(t *testing.T, id, name string, phase v1alpha1.Phase) {
	t.Helper()
	p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{v1alpha1.LabelClusterName: name}}}
	// The CRD is established, but the API server's discovery may not
	// list its group yet: wait that out, and only that.
	var err error
	for range 100 {
		if err = e.admin.Create(t.Context(), p); !strings.Contains(fmt.Sprint(err), "no matches for") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	p.Status = v1alpha1.PeerStatus{ClusterName: name, Phase: phase, Endpoint: "198.18.0.2:51820", Sources: []string{"mdns"},
		TheirNetworks: []v1alpha1.NetworkView{{Range: "10.0.0.0/16", As: "100.96.0.0/16"}}, ObservedGeneration: p.Generation}
	if err := e.admin.Status().Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

// actAsAgent waits for the Peer's spec to say networking, then writes
// each status in turn, as of that generation, each once the command has
// shown the one before (so that each is seen).
func (e *peerEnv) actAsAgent(t *testing.T, id string, networking v1alpha1.Networking, out *syncbuf.Buffer, steps ...v1alpha1.PeerStatus) {
	var p v1alpha1.Peer
	eventually.Within(t, time.Minute, "spec.networking "+string(networking), func() error {
		if err := e.admin.Get(t.Context(), client.ObjectKey{Name: id}, &p); err != nil {
			return err
		}
		if p.Spec.Networking != networking {
			return fmt.Errorf("spec.networking %q", p.Spec.Networking)
		}
		return nil
	})
	for _, s := range steps {
		s.ObservedGeneration = p.Generation
		s.ClusterName = p.Status.ClusterName
		p.Status = s
		if err := e.admin.Status().Update(t.Context(), &p); err != nil {
			t.Error(err)
			return
		}
		eventually.Within(t, time.Minute, "the command shows "+string(s.Phase), func() error {
			if !strings.Contains(out.String(), "  "+string(s.Phase)) {
				return fmt.Errorf("output so far:\n%s", out.String())
			}
			return nil
		})
	}
}

func cond(t, reason, msg string, ok bool) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}
}

// flotilla runs the command in-process and returns its exit code and
// output.
func flotilla(args ...string) (int, string, string) {
	var out, errOut syncbuf.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// The operator verbs against a real API server: peer list in every
// format, accept and deny with their progress, and the errors that say
// what to do.
func TestPeerVerbs(t *testing.T) {
	e := newPeerEnv(t)
	kc := "--kubeconfig=" + e.cp.Kubeconfig
	e.addPeer(t, "cbeta", "beta", v1alpha1.PhaseConnected)
	e.addPeer(t, "cgamma", "gamma", v1alpha1.PhaseDiscovered)

	t.Run("list", func(t *testing.T) {
		code, out, errOut := flotilla("peer", "list", kc)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 0 || len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "CLUSTER ID PHASE NETWORKING ENDPOINT HANDSHAKE AGE" ||
			!strings.HasPrefix(lines[1], "beta ") || !strings.Contains(lines[1], "Connected") || !strings.Contains(lines[1], "(default)") ||
			!strings.HasPrefix(lines[2], "gamma ") {
			t.Errorf("peer list: exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("list -o wide", func(t *testing.T) {
		code, out, _ := flotilla("peer", "list", kc, "--output=wide")
		if code != 0 || !strings.Contains(out, "THEIRS AS SEEN HERE") || !strings.Contains(out, "10.0.0.0/16->100.96.0.0/16") ||
			!strings.Contains(out, "SOURCES") || !strings.Contains(out, "mdns") {
			t.Errorf("peer list -o wide: exit %d\n%s", code, out)
		}
	})
	for _, format := range []string{"json", "yaml"} {
		t.Run("list -o "+format, func(t *testing.T) {
			code, out, errOut := flotilla("peer", "list", kc, "-o", format)
			var list struct {
				APIVersion string          `json:"apiVersion"`
				Kind       string          `json:"kind"`
				Items      []v1alpha1.Peer `json:"items"`
			}
			var err error
			if format == "json" {
				err = json.Unmarshal([]byte(out), &list)
			} else {
				err = yaml.UnmarshalStrict([]byte(out), &list)
			}
			if code != 0 || err != nil || list.APIVersion != "v1" || list.Kind != "List" || len(list.Items) != 2 || list.Items[0].Kind != "Peer" ||
				list.Items[0].Name != "cbeta" || list.Items[0].Status.Phase != v1alpha1.PhaseConnected || list.Items[0].ManagedFields != nil {
				t.Errorf("peer list -o %s: exit %d, %v\n%s%s", format, code, err, out, errOut)
			}
		})
	}
	t.Run("list -o name", func(t *testing.T) {
		code, out, _ := flotilla("peer", "list", kc, "-o", "name")
		if code != 0 || out != "peer.flotilla.io/cbeta\npeer.flotilla.io/cgamma\n" {
			t.Errorf("peer list -o name: exit %d\n%s", code, out)
		}
	})
	t.Run("status -o name", func(t *testing.T) {
		code, out, _ := flotilla("status", kc, "-o", "name")
		if code != 0 || out != "peer.flotilla.io/cbeta\npeer.flotilla.io/cgamma\n" {
			t.Errorf("status -o name: exit %d\n%s", code, out)
		}
	})
	t.Run("grant -o json prints the Peer, progress on stderr", func(t *testing.T) {
		code, out, errOut := flotilla("grant", "cgamma", kc, "--wait=0", "--pods=3", "-o", "json")
		var p v1alpha1.Peer
		err := json.Unmarshal([]byte(out), &p)
		if code != 0 || err != nil || p.Kind != "Peer" || p.Name != "cgamma" || p.Spec.Offloading != v1alpha1.OffloadingGrant ||
			p.Spec.OffloadLimits == nil || *p.Spec.OffloadLimits.Pods != 3 || p.ManagedFields != nil || !strings.Contains(errOut, "offloading granted in spec") {
			t.Errorf("grant -o json: exit %d, %v\n%s%s", code, err, out, errOut)
		}
	})
	t.Run("grant -o wide and revoke -o yaml|name", func(t *testing.T) {
		code, out, _ := flotilla("grant", "cgamma", kc, "--wait=0", "-o", "wide")
		if code != 0 || !strings.Contains(out, "THEIRS AS SEEN HERE") || !strings.Contains(out, "gamma") {
			t.Errorf("grant -o wide: exit %d\n%s", code, out)
		}
		code, out, _ = flotilla("revoke", "cgamma", kc, "--wait=0", "-o", "yaml")
		var p v1alpha1.Peer
		if err := yaml.UnmarshalStrict([]byte(out), &p); code != 0 || err != nil || p.Spec.Offloading != v1alpha1.OffloadingDeny {
			t.Errorf("revoke -o yaml: exit %d, %v\n%s", code, err, out)
		}
		if code, out, _ = flotilla("revoke", "cgamma", kc, "--wait=0", "-o", "name"); code != 0 || out != "peer.flotilla.io/cgamma\n" {
			t.Errorf("revoke -o name: exit %d\n%s", code, out)
		}
		if code, _, errOut := flotilla("grant", "cgamma", kc, "--wait=0", "-o", "table"); code != 2 || !strings.Contains(errOut, "want wide, json, yaml or name") {
			t.Errorf("grant -o table: exit %d, %s", code, errOut)
		}
	})
	t.Run("flags before the name", func(t *testing.T) {
		code, out, errOut := flotilla("grant", kc, "--pods", "2", "--wait=0", "-o", "name", "cgamma")
		if code != 0 || out != "peer.flotilla.io/cgamma\n" {
			t.Errorf("grant FLAGS cgamma: exit %d\n%s%s", code, out, errOut)
		}
		var p v1alpha1.Peer
		if err := e.admin.Get(t.Context(), client.ObjectKey{Name: "cgamma"}, &p); err != nil || p.Spec.OffloadLimits == nil || *p.Spec.OffloadLimits.Pods != 2 {
			t.Errorf("grant FLAGS cgamma did not write --pods 2: %v, %+v", err, p.Spec)
		}
		if code, out, errOut := flotilla("revoke", "--wait=0", kc, "cgamma", "-o=name"); code != 0 || out != "peer.flotilla.io/cgamma\n" {
			t.Errorf("revoke FLAGS cgamma: exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("show", func(t *testing.T) {
		code, out, errOut := flotilla("peer", "show", "gamma", kc)
		if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "THEIRS AS SEEN HERE") || !strings.HasPrefix(lines[1], "gamma ") {
			t.Errorf("peer show gamma: exit %d\n%s%s", code, out, errOut)
		}
		code, out, errOut = flotilla("peer", "show", "-o", "json", kc, "cgamma")
		var p v1alpha1.Peer
		if err := json.Unmarshal([]byte(out), &p); code != 0 || err != nil || p.Kind != "Peer" || p.Name != "cgamma" || p.ManagedFields != nil {
			t.Errorf("peer show -o json cgamma: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		code, out, errOut = flotilla("peer", "show", "-o", "yaml", kc, "beta")
		if err := yaml.UnmarshalStrict([]byte(out), &p); code != 0 || err != nil || p.Name != "cbeta" {
			t.Errorf("peer show -o yaml beta: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		if code, _, errOut := flotilla("peer", "show", "delta", kc); code != 1 || !strings.Contains(errOut, `no peer named "delta"; the peers are: beta (cbeta), gamma (cgamma)`) {
			t.Errorf("peer show delta: exit %d, %s", code, errOut)
		}
	})
	t.Run("list -o bad", func(t *testing.T) {
		code, _, errOut := flotilla("peer", "list", kc, "-o", "table")
		if code != 2 || !strings.Contains(errOut, "want wide, json, yaml or name") {
			t.Errorf("peer list -o table: exit %d, %s", code, errOut)
		}
	})

	t.Run("--context picks the kubeconfig's context", func(t *testing.T) {
		cfg, err := clientcmd.LoadFromFile(e.cp.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		real := cfg.CurrentContext
		// The current context is a cluster that does not answer.
		cfg.Clusters["gone"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:9", InsecureSkipTLSVerify: true}
		cfg.Contexts["gone"] = &clientcmdapi.Context{Cluster: "gone", AuthInfo: cfg.Contexts[real].AuthInfo}
		cfg.CurrentContext = "gone"
		two := filepath.Join(t.TempDir(), "kubeconfig")
		if err := clientcmd.WriteToFile(*cfg, two); err != nil {
			t.Fatal(err)
		}
		if code, _, errOut := flotilla("peer", "list", "--kubeconfig", two); code != 1 || !strings.Contains(errOut, "cannot reach the API server") {
			t.Errorf("peer list in context gone: exit %d, %s", code, errOut)
		}
		if code, out, errOut := flotilla("peer", "list", "--kubeconfig", two, "--context", real, "-o", "name"); code != 0 || !strings.Contains(out, "peer.flotilla.io/cbeta") {
			t.Errorf("peer list --context %s: exit %d\n%s%s", real, code, out, errOut)
		}
		if code, out, errOut := flotilla("status", "--kubeconfig", two, "--context", real, "-o", "name"); code != 0 || !strings.Contains(out, "peer.flotilla.io/cbeta") {
			t.Errorf("status --context %s: exit %d\n%s%s", real, code, out, errOut)
		}
		if code, _, errOut := flotilla("peer", "accept", "nobody", "--kubeconfig", two, "--context", real); code != 1 || !strings.Contains(errOut, `no peer named "nobody"`) {
			t.Errorf("peer accept --context %s: exit %d, %s", real, code, errOut)
		}
		if code, out, errOut := flotilla("grant", "--context", real, "cgamma", "--kubeconfig", two, "--wait=0", "-o", "name"); code != 0 || out != "peer.flotilla.io/cgamma\n" {
			t.Errorf("grant --context %s: exit %d\n%s%s", real, code, out, errOut)
		}
		if code, _, errOut := flotilla("status", "--kubeconfig", two, "--context", "nope"); code != 1 || !strings.Contains(errOut, `no context "nope" in `+two+"; its contexts are: ") || !strings.Contains(errOut, real) {
			t.Errorf("status --context nope: exit %d, %s", code, errOut)
		}
	})

	t.Run("accept unknown peer names the peers", func(t *testing.T) {
		code, _, errOut := flotilla("peer", "accept", "delta", kc)
		if code != 1 || !strings.Contains(errOut, `no peer named "delta"; the peers are: beta (cbeta), gamma (cgamma)`) {
			t.Errorf("peer accept delta: exit %d, %s", code, errOut)
		}
	})

	t.Run("accept shows progress until Connected", func(t *testing.T) {
		var out, errOut syncbuf.Buffer
		done := make(chan int, 1)
		go func() { done <- run([]string{"peer", "accept", "gamma", kc}, &out, &errOut) }()
		e.actAsAgent(t, "cgamma", v1alpha1.NetworkingAccept, &out,
			v1alpha1.PeerStatus{Phase: v1alpha1.PhaseNegotiating, Conditions: []metav1.Condition{
				cond(v1alpha1.ConditionMember, "Alive", "member", true),
				cond(v1alpha1.ConditionAccepted, "Accepted", "both sides accept networking", true),
				cond(v1alpha1.ConditionViewsAgreed, "Pending", "views not exchanged yet", false)}},
			v1alpha1.PeerStatus{Phase: v1alpha1.PhaseConnected})
		code := <-done
		want := []string{"peer gamma (cgamma): networking Accept in spec", "  Negotiating: ViewsAgreed Pending: views not exchanged yet", "  Connected\n", "peer gamma (cgamma): Connected"}
		if code != 0 || !inOrder(out.String(), want...) {
			t.Errorf("peer accept gamma: exit %d\n%s%s\nwant, in order: %q", code, out.String(), errOut.String(), want)
		}
	})

	t.Run("accept that does not connect says what holds it", func(t *testing.T) {
		// Deny first, so that accept changes the spec again; the agent's
		// answer to accept (the next generation) is in place before the
		// command looks.
		if code, _, errOut := flotilla("peer", "deny", "beta", kc, "--wait=0"); code != 0 {
			t.Fatalf("peer deny: %s", errOut)
		}
		var p v1alpha1.Peer
		if err := e.admin.Get(t.Context(), client.ObjectKey{Name: "cbeta"}, &p); err != nil {
			t.Fatal(err)
		}
		p.Status.Phase, p.Status.ObservedGeneration = v1alpha1.PhaseDegraded, p.Generation+1
		p.Status.Conditions = []metav1.Condition{
			cond(v1alpha1.ConditionAccepted, "Accepted", "both sides accept networking", true),
			cond(v1alpha1.ConditionTunnelUp, "NoHandshake", "configured; no recent WireGuard handshake", false)}
		if err := e.admin.Status().Update(t.Context(), &p); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := flotilla("peer", "accept", "cbeta", kc, "--wait=2s")
		if code != 1 || !strings.Contains(out, "  Degraded: TunnelUp NoHandshake") ||
			!strings.Contains(errOut, "peer beta (cbeta) is Degraded after 2s, not Connected: TunnelUp NoHandshake: configured; no recent WireGuard handshake") ||
			!strings.Contains(errOut, "flotilla peer list -o wide") {
			t.Errorf("peer accept beta: exit %d\n%s%s", code, out, errOut)
		}
	})

	t.Run("accept of a peer that denies this cluster says so at once", func(t *testing.T) {
		e.addPeer(t, "cepsilon", "epsilon", v1alpha1.PhaseDenied)
		var p v1alpha1.Peer
		if err := e.admin.Get(t.Context(), client.ObjectKey{Name: "cepsilon"}, &p); err != nil {
			t.Fatal(err)
		}
		// The agent's answer to the accept (the next generation): the
		// other side denies.
		p.Status.ObservedGeneration = p.Generation + 1
		p.Status.Conditions = []metav1.Condition{cond(v1alpha1.ConditionAccepted, "DeniedByPeer", "the peer denies networking with this cluster", false)}
		if err := e.admin.Status().Update(t.Context(), &p); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := flotilla("peer", "accept", "epsilon", kc, "--wait=1m")
		if code != 1 || !strings.Contains(errOut, "peer epsilon (cepsilon) is Denied: Accepted DeniedByPeer: the peer denies networking with this cluster; its admin accepts this cluster there with `flotilla peer accept`") {
			t.Errorf("peer accept epsilon: exit %d, %s", code, errOut)
		}
	})

	t.Run("accept without an agent says so", func(t *testing.T) {
		if code, _, errOut := flotilla("peer", "deny", "beta", kc, "--wait=0"); code != 0 {
			t.Fatalf("peer deny: %s", errOut)
		}
		code, _, errOut := flotilla("peer", "accept", "beta", kc, "--wait=1s")
		if code != 1 || !strings.Contains(errOut, "the agent has not acted on the change within 1s (is it running?") {
			t.Errorf("peer accept with no agent: exit %d, %s", code, errOut)
		}
	})

	t.Run("deny waits until Denied", func(t *testing.T) {
		var out, errOut syncbuf.Buffer
		done := make(chan int, 1)
		go func() { done <- run([]string{"peer", "deny", "gamma", kc}, &out, &errOut) }()
		e.actAsAgent(t, "cgamma", v1alpha1.NetworkingDeny, &out, v1alpha1.PeerStatus{Phase: v1alpha1.PhaseDenied, Conditions: []metav1.Condition{
			cond(v1alpha1.ConditionAccepted, "DeniedHere", "spec.networking is Deny", false)}})
		code := <-done
		if code != 0 || !inOrder(out.String(), "networking Deny in spec", "  Denied: Accepted DeniedHere: spec.networking is Deny", "peer gamma (cgamma): Denied") {
			t.Errorf("peer deny gamma: exit %d\n%s%s", code, out.String(), errOut.String())
		}
	})

	t.Run("forbidden names the verb and the resource", func(t *testing.T) {
		readOnly := e.userKubeconfig(t, "alice", "get", "list", "watch")
		if code, out, errOut := flotilla("peer", "list", "--kubeconfig="+readOnly); code != 0 || !strings.Contains(out, "beta") {
			t.Fatalf("alice may list: exit %d\n%s%s", code, out, errOut)
		}
		code, _, errOut := flotilla("peer", "deny", "gamma", "--kubeconfig="+readOnly)
		if code != 1 || !strings.Contains(errOut, "you may not patch peers.flotilla.io") || !strings.Contains(errOut, "kubectl create clusterrole flotilla-peers") {
			t.Errorf("alice denies: exit %d, %s", code, errOut)
		}
		var p v1alpha1.Peer
		if err := e.admin.Get(t.Context(), client.ObjectKey{Name: "cgamma"}, &p); err != nil || p.Spec.Networking != v1alpha1.NetworkingDeny {
			t.Errorf("the refused command changed the Peer: %v, spec %+v", err, p.Spec)
		}
		nobody := e.userKubeconfig(t, "bob")
		code, _, errOut = flotilla("peer", "list", "--kubeconfig="+nobody)
		if code != 1 || !strings.Contains(errOut, "you may not list peers.flotilla.io") {
			t.Errorf("bob lists: exit %d, %s", code, errOut)
		}
	})

	t.Run("kubectl plugin", func(t *testing.T) {
		kubectl, err := exec.LookPath("kubectl")
		if err != nil {
			kubectl = filepath.Join(harness.KubeBinDir(), "kubectl")
		}
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := os.Symlink(self, filepath.Join(dir, "kubectl-flotilla")); err != nil {
			t.Fatal(err)
		}
		kubectlFlotilla := func(args ...string) (string, error) {
			if len(args) > 0 && args[0] == "__complete" {
				args = append([]string{"__complete", "flotilla"}, args[1:]...)
			} else {
				args = append([]string{"flotilla"}, args...)
			}
			cmd := exec.Command(kubectl, args...)
			cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+e.cp.Kubeconfig)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := kubectlFlotilla("peer", "list"); err != nil || !strings.Contains(out, "beta") || !strings.Contains(out, "gamma") {
			t.Errorf("kubectl flotilla peer list: %v\n%s", err, out)
		}
		if out, err := kubectlFlotilla("help"); err != nil || !strings.Contains(out, "\n  kubectl flotilla [command]") || strings.Contains(out, "\n  flotilla ") {
			t.Errorf("kubectl flotilla help: %v\n%s", err, out)
		}
		// kubectl runs kubectl_complete-flotilla to complete the words
		// after "kubectl flotilla": a peer's name, from the cluster.
		if err := os.Symlink(self, filepath.Join(dir, "kubectl_complete-flotilla")); err != nil {
			t.Fatal(err)
		}
		if out, err := kubectlFlotilla("__complete", "peer", "accept", ""); err != nil || !strings.Contains(out, "beta\tcbeta") || !strings.Contains(out, "gamma\tcgamma") {
			t.Errorf("kubectl __complete flotilla peer accept: %v\n%s", err, out)
		}
		if out, err := kubectlFlotilla("peer", "accept", "delta"); err == nil || !strings.Contains(out, "kubectl flotilla peer accept: no peer named") {
			t.Errorf("kubectl flotilla peer accept delta: %v\n%s", err, out)
		}
	})

	// Last: it removes the Peers.
	t.Run("without Flotilla installed", func(t *testing.T) {
		crds := apiextensionsclient.NewForConfigOrDie(e.cp.Config).ApiextensionsV1().CustomResourceDefinitions()
		if err := crds.Delete(t.Context(), "peers.flotilla.io", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, time.Minute, "peer list says Flotilla is not installed", func() error {
			code, out, errOut := flotilla("peer", "list", kc)
			if code != 1 || !strings.Contains(errOut, "this cluster has no Peers resource: is Flotilla installed (docs/install.md)?") {
				return fmt.Errorf("exit %d\n%s%s", code, out, errOut)
			}
			return nil
		})
	})
}

// userKubeconfig writes a kubeconfig that acts as user (impersonated by
// the admin), allowed verbs on peers and nothing else.
func (e *peerEnv) userKubeconfig(t *testing.T, user string, verbs ...string) string {
	t.Helper()
	ctx := context.Background()
	if len(verbs) > 0 {
		rbac := e.cp.Client.RbacV1()
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "peers-" + user},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"flotilla.io"}, Resources: []string{"peers"}, Verbs: verbs}}}
		if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "peers-" + user},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
		if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := clientcmd.LoadFromFile(e.cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
	}
	path := filepath.Join(t.TempDir(), user+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	if len(verbs) > 0 {
		// RBAC caches: wait until the grant is in force.
		eventually.Within(t, time.Minute, user+"'s role in force", func() error {
			c, err := clusterClient(path)
			if err != nil {
				return err
			}
			return c.List(ctx, &v1alpha1.PeerList{})
		})
	}
	return path
}

// inOrder reports whether s contains each of parts, in that order.
func inOrder(s string, parts ...string) bool {
	for _, p := range parts {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}

// peer without a verb, or with one it does not know, lists the verbs and
// exits 2; -h lists them and exits 0; a verb without its NAME says so.
func TestPeerUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "flotilla peer: say what to do"},
		{[]string{"connect", "beta"}, 2, `flotilla peer: unknown verb "connect"`},
		{[]string{"-h"}, 0, "\n  flotilla peer [command]"},
		{[]string{"accept"}, 2, "flotilla peer accept: name the peer (its cluster name or ID"},
		{[]string{"deny", "--wait=0"}, 2, "flotilla peer deny: name the peer"},
		{[]string{"list", "beta"}, 2, `unexpected argument "beta"`},
		{[]string{"lst"}, 2, `unknown verb "lst"; did you mean list?`},
	} {
		code, out, errOut := flotilla(append([]string{"peer"}, tc.args...)...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("peer %q: exit %d, output:\n%s%s\nwant %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
		if tc.code == 2 && strings.Contains(tc.want, "say what") && !strings.Contains(errOut, "connect to a peer (spec.networking: Accept)") {
			t.Errorf("peer %q: the verbs are not listed:\n%s", tc.args, errOut)
		}
	}
}

func TestProgramName(t *testing.T) {
	for argv0, want := range map[string]string{
		"flotilla": "flotilla", "/usr/local/bin/flotilla": "flotilla", "./bin/kubectl-flotilla": "kubectl flotilla",
		"/usr/local/bin/kubectl-flotilla": "kubectl flotilla", "kubectl-flotilla-old": "flotilla",
	} {
		if got := programName(argv0); got != want {
			t.Errorf("programName(%q) = %q, want %q", argv0, got, want)
		}
	}
}

// A kubeconfig whose API server does not answer is named as such.
func TestPeerListUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["gone"] = &clientcmdapi.Cluster{Server: "https://" + addr, InsecureSkipTLSVerify: true}
	cfg.AuthInfos["me"] = &clientcmdapi.AuthInfo{Token: "x"}
	cfg.Contexts["gone"] = &clientcmdapi.Context{Cluster: "gone", AuthInfo: "me"}
	cfg.CurrentContext = "gone"
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := flotilla("peer", "list", "--kubeconfig", kubeconfig)
	if code != 1 || !strings.Contains(errOut, "cannot reach the API server") || !strings.Contains(errOut, addr) {
		t.Errorf("peer list against %s: exit %d, %s", addr, code, errOut)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

const agentAccount = "system:serviceaccount:" + federation.AgentNamespace + ":flotilla-agent"

// The agent as a cluster runs it: two clusters with overlapping pod
// networks, each a real gateway node on a shared LAN, install the agent
// with `kubectl apply -k` of deploy/ (plus only the cluster's settings)
// from its own image, built from this checkout (federation.OnNodes). The
// agents run as pods under their service account, connect, and real pods
// on the gateway nodes talk by their views; `kubectl logs` shows the
// agent's log; the account can do exactly what docs/install.md lists.
// Nothing of the run is left.
func TestAgentPodFromManifests(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	var run string
	t.Run("federation", func(t *testing.T) {
		env := harness.New(t)
		run = env.RunID
		start := time.Now()
		cs := federation.OnNodes(t, env, federation.NodeOptions{Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
		for _, c := range cs {
			t.Logf("cluster %s: kubectl apply -k %s", c.Name, c.Install)
		}
		federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
		t.Logf("Peers Connected: %s", time.Since(start).Round(time.Millisecond))

		t.Run("pods on the gateway nodes talk by their views", func(t *testing.T) {
			for _, from := range cs {
				for _, to := range cs {
					if from != to {
						if r := federation.Fetch(t, from, to); r.Err != nil {
							t.Errorf("%s -> %s (%s): %v", from.Name, to.Name, r.Dst, r.Err)
						}
					}
				}
			}
		})
		// Before the logs are read: the agents' grants work shows there.
		t.Run("grants", func(t *testing.T) { testGrants(t, cs[0], cs[1]) })
		t.Run("flotilla info shows the install ready", func(t *testing.T) {
			for _, c := range cs {
				eventually.Within(t, 90*time.Second, c.Name+"'s install ready in flotilla info", func() error { return installReady(t, c) })
				out, err := flotillaCLI(t, c, "info")
				if err != nil || !strings.Contains(out, "Fences          enforced") {
					t.Errorf("flotilla info of %s: %v\n%s", c.Name, err, out)
				}
				t.Logf("flotilla info of %s:\n%s", c.Name, out)
			}
		})
		t.Run("flotilla version reads each agent's build", func(t *testing.T) {
			for _, c := range cs {
				testVersion(t, c)
			}
		})
		t.Run("kubectl logs shows the agent's log", func(t *testing.T) {
			for _, c := range cs {
				logs := mustKubectl(t, c.CP, "-n", federation.AgentNamespace, "logs", "deployment/flotilla-agent")
				// In-cluster configuration: the service account's token,
				// the API server at KUBERNETES_SERVICE_HOST:PORT.
				for _, want := range []string{
					`"msg":"agent starting"`,
					fmt.Sprintf(`"apiServer":"https://127.0.0.1:%d"`, c.CP.Addr.Port()),
					`"msg":"agent running"`,
				} {
					if !strings.Contains(logs, want) {
						t.Errorf("kubectl logs of %s's agent lacks %s:\n%s", c.Name, want, logs)
					}
				}
				// Everything it did, it was allowed to: no grant is missing.
				for _, line := range strings.Split(logs, "\n") {
					if strings.Contains(line, "forbidden") {
						t.Errorf("%s's agent was refused something: %s", c.Name, line)
					}
				}
			}
		})
		t.Run("the agent runs with NET_ADMIN only", func(t *testing.T) {
			for _, c := range cs {
				if got := agentCapabilities(t, c); got != "0000000000001000" {
					t.Errorf("agent process of %s has effective capabilities %s, want 0000000000001000 (NET_ADMIN)", c.Name, got)
				}
			}
		})
		t.Run("the agent's account can do what docs/install.md lists", func(t *testing.T) {
			testAgentAccess(t, cs[0].CP)
		})
	})
	if left := harness.Leftovers(run); len(left) > 0 {
		t.Fatalf("run %s left behind: %v", run, left)
	}
}

// agentCapabilities returns the effective capabilities (CapEff) of the
// agent's process, as the node's containerd started it.
func agentCapabilities(t *testing.T, c *federation.NodeCluster) string {
	t.Helper()
	pods, err := c.CP.Client.CoreV1().Pods(federation.AgentNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: federation.AgentSelector})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("agent pod of %s: %v (err %v)", c.Name, pods, err)
	}
	id := strings.TrimPrefix(pods.Items[0].Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := c.Gateway.Ctr(context.Background(), "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			status, err := os.ReadFile("/proc/" + f[1] + "/status")
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(string(status), "\n") {
				if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
					return strings.TrimSpace(v)
				}
			}
		}
	}
	t.Fatalf("no task of the agent's container %s on %s's gateway:\n%s", id, c.Name, out)
	return ""
}

// documentedAccess is the table "Permissions, and why nothing more" of
// docs/install.md as `kubectl auth can-i --list` prints it, per
// namespace: the cluster-wide grants show in every namespace.
func documentedAccess() map[string][]string {
	cluster := []string{
		"peers.flotilla.io [] [create delete get list patch update watch]",
		"peers.flotilla.io/status [] [get patch update]",
		"namespaceoffloads.flotilla.io [] [get list patch update watch]",
		"namespaceoffloads.flotilla.io/status [] [get patch update]",
		"namespacerequests.flotilla.io [] [get list patch update watch]",
		"namespacerequests.flotilla.io/status [] [get patch update]",
		"nodes [] [create delete get list patch update watch]",
		"nodes/status [] [patch update]",
		// Offloaded pods, their events, the kubelet API's checks.
		"pods [] [delete get list watch]",
		"pods/status [] [patch update]",
		"events [] [create patch]",
		"events.events.k8s.io [] [create patch]",
		"subjectaccessreviews.authorization.k8s.io [] [create]",
		// The metrics port's readers: who a token is.
		"tokenreviews.authentication.k8s.io [] [create]",
		"servicecidrs.networking.k8s.io [] [list]",
		// The pod blocks a CNI with its own IPAM allocated (Calico,
		// Cilium), read only.
		"blockaffinities.crd.projectcalico.org [] [list watch]",
		"ciliumnodes.cilium.io [] [list watch]",
		// Fences: the admission policies, read to prove them in force.
		"validatingadmissionpolicies.admissionregistration.k8s.io [] [list watch]",
		"validatingadmissionpolicybindings.admissionregistration.k8s.io [] [list watch]",
		"customresourcedefinitions.apiextensions.k8s.io [peers.flotilla.io] [create get patch update]",
		"customresourcedefinitions.apiextensions.k8s.io [namespaceoffloads.flotilla.io] [create get patch update]",
		"customresourcedefinitions.apiextensions.k8s.io [namespacerequests.flotilla.io] [create get patch update]",
		// Grants: tenant namespaces and what is in them (admission.yaml
		// confines the writes to tenants).
		"namespaces [] [create delete get list patch watch]",
		"serviceaccounts [] [create delete get patch]",
		"serviceaccounts/token [flotilla-consumer] [create]",
		"rolebindings.rbac.authorization.k8s.io [] [create delete get patch]",
		"clusterroles.rbac.authorization.k8s.io [flotilla-consumer] [bind]",
		"resourcequotas [] [create delete get patch]",
		"limitranges [] [create delete get patch]",
		"networkpolicies.networking.k8s.io [] [create delete get list patch watch]",
		// The grant's Secret, written only, in tenants (admission);
		// reflection reads Secrets and ConfigMaps only in offloaded
		// namespaces, through a RoleBinding made there
		// (docs/services.md).
		"secrets [] [create delete patch]",
		// Services: reflection and the MCS API read them all and write
		// only their own (the policy flotilla-agent-service-objects).
		"services [] [create delete get list patch update watch]",
		"endpointslices.discovery.k8s.io [] [create delete get list patch update watch]",
		"serviceexports.multicluster.x-k8s.io [] [get list watch]",
		"serviceexports.multicluster.x-k8s.io/status [] [get patch update]",
		"serviceimports.multicluster.x-k8s.io [] [create delete get list patch update watch]",
		"serviceimports.multicluster.x-k8s.io/status [] [get patch update]",
		"clusterproperties.about.k8s.io [] [create get update]",
		"customresourcedefinitions.apiextensions.k8s.io [serviceexports.multicluster.x-k8s.io] [create get patch update]",
		"customresourcedefinitions.apiextensions.k8s.io [serviceimports.multicluster.x-k8s.io] [create get patch update]",
		"customresourcedefinitions.apiextensions.k8s.io [clusterproperties.about.k8s.io] [create get patch update]",
		// Placement: its one webhook configuration.
		"mutatingwebhookconfigurations.admissionregistration.k8s.io [flotilla-placement] [create delete get list patch watch]",
	}
	ns := func(rows ...string) []string { return append(slices.Clone(cluster), rows...) }
	// The role label on its own pods (docs/ha.md): patch in its
	// namespace, which can-i merges with the cluster's verbs on pods.
	agentNS := func(rows ...string) []string {
		all := ns(rows...)
		all[slices.Index(all, "pods [] [delete get list watch]")] = "pods [] [delete get list patch watch]"
		return all
	}
	return map[string][]string{
		federation.AgentNamespace: agentNS(
			"leases.coordination.k8s.io [] [create]",
			"leases.coordination.k8s.io [flotilla-agent] [get list update watch]",
			"deployments.apps [flotilla-agent] [get]",
			"daemonsets.apps [flotilla-fabric] [create get patch]",
			"configmaps [flotilla-fabric] [create get patch]",
			"secrets [flotilla-placement-ca] [create get patch]",
			"secrets [flotilla-kubelet-ca] [create get patch]",
			// The ledger's snapshot (docs/ha.md).
			"secrets [flotilla-ledger] [get list patch update watch]",
			// The federation keyring it follows, and where it reports
			// the fingerprints it holds (docs/operations.md).
			"secrets [flotilla-federation] [get list watch]",
			"configmaps [flotilla-federation-keys] [create get patch]",
			// The join token it publishes (docs/security.md).
			"secrets [flotilla-join] [create get patch]"),
		"default":     ns("endpointslices.discovery.k8s.io [kubernetes] [get]", "services [kubernetes] [get]"),
		"kube-system": ns("configmaps [kubeadm-config] [get]", "configmaps [extension-apiserver-authentication] [get list watch]"),
		"kube-public": ns("configmaps [cluster-info] [get]"),
	}
}

// testAgentAccess compares what the agent's account may do, beyond what
// every service account may (the `GET /readyz` of the table is one of
// those), with docs/install.md, and has it refused a request outside it.
func testAgentAccess(t *testing.T, cp *harness.ControlPlane) {
	for ns, want := range documentedAccess() {
		granted := canIList(t, cp, ns, agentAccount)
		everyone := canIList(t, cp, ns, "system:serviceaccount:"+federation.AgentNamespace+":nobody")
		var got []string
		for _, row := range granted {
			if !slices.Contains(everyone, row) {
				got = append(got, row)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("namespace %s: the agent may\n  %s\nbeyond every service account; docs/install.md says\n  %s",
				ns, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	for _, refused := range [][]string{
		{"-n", "default", "create", "secret", "generic", "probe", "--from-literal=k=v"},
		{"-n", "default", "create", "configmap", "probe", "--from-literal=k=v"},
	} {
		out, err := federation.Kubectl(cp, append(refused, "--as", agentAccount)...)
		if err == nil || !strings.Contains(strings.ToLower(out), "forbidden") {
			t.Errorf("kubectl %s as the agent: %v, want Forbidden:\n%s", strings.Join(refused, " "), err, out)
		}
	}
}

// canIList returns `kubectl auth can-i --list` of user in ns, one row per
// rule: "resource [names] [verbs]" or "[urls] [verbs]", verbs sorted.
func canIList(t *testing.T, cp *harness.ControlPlane, ns, user string) []string {
	t.Helper()
	out := mustKubectl(t, cp, "auth", "can-i", "--list", "-n", ns, "--as", user)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	urls, names, verbs := strings.Index(header, "Non-Resource URLs"), strings.Index(header, "Resource Names"), strings.Index(header, "Verbs")
	if urls < 0 || names < 0 || verbs < 0 {
		t.Fatalf("kubectl auth can-i --list: unexpected header %q", header)
	}
	var rows []string
	for _, line := range lines[1:] {
		line += strings.Repeat(" ", max(0, verbs-len(line)))
		v := strings.Fields(strings.Trim(strings.TrimSpace(line[verbs:]), "[]"))
		slices.Sort(v)
		resource := strings.TrimSpace(line[:urls])
		verbList := "[" + strings.Join(v, " ") + "]"
		if resource == "" {
			rows = append(rows, strings.TrimSpace(line[urls:names])+" "+verbList)
		} else {
			rows = append(rows, resource+" "+strings.TrimSpace(line[names:verbs])+" "+verbList)
		}
	}
	return rows
}

func mustKubectl(t testing.TB, cp *harness.ControlPlane, args ...string) string {
	t.Helper()
	out, err := federation.Kubectl(cp, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// installReady reads `flotilla info -o json` of c and says what is not
// ready: the agent and each of its checks, the fences proven, the fabric
// on every node, the placement webhook, the clusterset DNS Service with
// an endpoint, the one peer Connected, and nothing left unread.
func installReady(t *testing.T, c *federation.NodeCluster) error {
	out, err := flotillaCLI(t, c, "info", "-o", "json")
	if err != nil {
		return fmt.Errorf("flotilla info: %v\n%s", err, out)
	}
	var info struct {
		Agent struct {
			Installed bool
			Replicas  int32
			Ready     int32
			Pods      []struct {
				Ready   bool
				Version string
				Checks  []struct {
					Name    string
					OK      bool
					Message string
				}
			}
		}
		Fences struct{ Known, Enforced bool }
		Fabric struct {
			Installed      bool
			Desired, Ready int32
			Nodes          []struct {
				Node  string
				Ready bool
			}
		}
		Webhook struct {
			Installed     bool
			CABundle      bool
			FailurePolicy string
		}
		ClustersetDNS struct {
			Installed      bool
			ReadyEndpoints int
		}
		Peers struct {
			Total  int
			Phases map[string]int
		}
		Notes []string
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return fmt.Errorf("flotilla info -o json: %v\n%s", err, out)
	}
	a := info.Agent
	if !a.Installed || a.Replicas != 1 || a.Ready != 1 || len(a.Pods) != 1 || !a.Pods[0].Ready || a.Pods[0].Version == "" || len(a.Pods[0].Checks) == 0 {
		return fmt.Errorf("agent %+v", a)
	}
	for _, ch := range a.Pods[0].Checks {
		if !ch.OK {
			return fmt.Errorf("agent check %s failed: %s", ch.Name, ch.Message)
		}
	}
	if !info.Fences.Known || !info.Fences.Enforced {
		return fmt.Errorf("fences %+v", info.Fences)
	}
	if f := info.Fabric; !f.Installed || f.Desired < 1 || f.Ready != f.Desired || len(f.Nodes) != int(f.Desired) {
		return fmt.Errorf("fabric %+v", f)
	}
	if w := info.Webhook; !w.Installed || !w.CABundle || w.FailurePolicy != "Fail" {
		return fmt.Errorf("webhook %+v", w)
	}
	if d := info.ClustersetDNS; !d.Installed || d.ReadyEndpoints < 1 {
		return fmt.Errorf("clusterset DNS %+v", d)
	}
	if p := info.Peers; p.Total != 1 || p.Phases["Connected"] != 1 {
		return fmt.Errorf("peers %+v", p)
	}
	if len(info.Notes) > 0 {
		return fmt.Errorf("not read: %q", info.Notes)
	}
	return nil
}

// testVersion: `flotilla version` with c's kubeconfig prints the client's
// build and each agent pod's, read from its /build, in one protocol range
// with the client's; with the token of an account granted nothing, it says
// what was refused.
func testVersion(t *testing.T, c *federation.NodeCluster) {
	out, err := flotillaCLI(t, c, "version", "-o", "json")
	var v struct {
		Client struct {
			Version  string
			Protocol struct{ Current, Min, Max int }
		}
		Agents []struct {
			Pod, Node, Error string
			Interoperates    bool
			Build            *struct {
				Version, Commit string
				Protocol        struct{ Current, Min, Max int }
			}
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || len(v.Agents) == 0 {
		t.Fatalf("flotilla version of %s: %v\n%s", c.Name, err, out)
	}
	for _, a := range v.Agents {
		if a.Build == nil || !a.Interoperates || a.Build.Version == "" || a.Build.Commit == "" || a.Build.Protocol != v.Client.Protocol || a.Node == "" {
			t.Errorf("flotilla version of %s: agent %+v, client %+v", c.Name, a, v.Client)
		}
	}
	out, err = flotillaCLI(t, c, "version")
	if err != nil || !strings.Contains(out, "agent "+v.Agents[0].Pod+" on "+v.Agents[0].Node+":") {
		t.Errorf("flotilla version of %s: %v\n%s", c.Name, err, out)
	}

	nobody := accountKubeconfig(t, c.CP, "flotilla-version-nobody")
	got, err := exec.Command(harness.Flotilla(t), "version", "--kubeconfig", nobody).CombinedOutput()
	// The refusal names the account: the API server saw its token.
	if err == nil || !strings.Contains(string(got), `deployments.apps "flotilla-agent" is forbidden: User "system:serviceaccount:default:flotilla-version-nobody"`) {
		t.Errorf("flotilla version as an account granted nothing: %v\n%s", err, got)
	}
}

// accountKubeconfig makes the ServiceAccount default/name, granted
// nothing, and writes a kubeconfig holding a token of its own.
func accountKubeconfig(t *testing.T, cp *harness.ControlPlane, name string) string {
	t.Helper()
	sas := cp.Client.CoreV1().ServiceAccounts("default")
	if _, err := sas.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sas.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	tr, err := sas.CreateToken(t.Context(), name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AuthInfos = map[string]*clientcmdapi.AuthInfo{name: {Token: tr.Status.Token}}
	cfg.Contexts[cfg.CurrentContext].AuthInfo = name
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

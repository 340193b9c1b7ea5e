package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// info against a real control plane, before and after deploy/ is
// applied: not installed, then the agent's Deployment and pod on the
// gateway node, the clusterset DNS Service, the peers by phase; what the
// pretend kubelet cannot serve (the agent's port) is a note, not a
// failure. Someone without rights is told what was refused, with their
// own token.
func TestInfo(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("info", harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Scheduler: true})
	cp.StartKubelet("gateway", harness.KubeletOptions{Labels: map[string]string{"flotilla.io/gateway": "true"}})
	kc := "--kubeconfig=" + cp.Kubeconfig

	code, out, errOut := flotilla("info", kc)
	if code != 1 || !strings.Contains(out, "not installed (no Deployment flotilla-system/flotilla-agent)") ||
		!strings.Contains(errOut, "Flotilla is not installed in flotilla-system") {
		t.Errorf("info before the install: exit %d\n%s%s", code, out, errOut)
	}

	kubectl := filepath.Join(harness.KubeBinDir(), "kubectl")
	if out, err := exec.Command(kubectl, "--kubeconfig", cp.Kubeconfig, "apply", "--server-side", "-k", "../../deploy").CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -k deploy/: %v\n%s", err, out)
	}
	if out, err := exec.Command(kubectl, "--kubeconfig", cp.Kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd/peers.flotilla.io").CombinedOutput(); err != nil {
		t.Fatalf("CRD not Established: %v\n%s", err, out)
	}
	admin, err := clusterClient(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for id, phase := range map[string]v1alpha1.Phase{"cbeta": v1alpha1.PhaseConnected, "cgamma": v1alpha1.PhaseConnected, "cdelta": v1alpha1.PhaseDegraded} {
		p := &v1alpha1.Peer{ObjectMeta: metav1.ObjectMeta{Name: id}}
		if err := admin.Create(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		p.Status = v1alpha1.PeerStatus{ClusterName: id[1:], Phase: phase}
		if err := admin.Status().Update(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}

	var info installInfo
	eventually.Within(t, 2*time.Minute, "info shows the agent's pod on the gateway node", func() error {
		code, out, errOut := flotilla("info", kc, "-o", "json")
		info = installInfo{}
		if err := json.Unmarshal([]byte(out), &info); code != 0 || err != nil {
			return fmt.Errorf("exit %d, %v\n%s%s", code, err, out, errOut)
		}
		// deploy/ runs two replicas, one per gateway node: with one
		// such node, one runs there and the standby waits for another.
		a := info.Agent
		if !a.Installed || a.Replicas != 2 || a.Ready != 1 || len(a.Pods) != 2 {
			return fmt.Errorf("agent %+v", a)
		}
		for _, p := range a.Pods {
			if p.Ready != (p.Node == "gateway") {
				return fmt.Errorf("agent %+v: want the pod on gateway ready and the other unscheduled", a)
			}
		}
		return nil
	})
	if d := info.ClustersetDNS; !d.Installed || d.Service != "flotilla-system/flotilla-clusterset-dns" || d.ClusterIP == "" {
		t.Errorf("clusterset DNS %+v", d)
	}
	if p := info.Peers; p.Total != 3 || p.Phases["Connected"] != 2 || p.Phases["Degraded"] != 1 {
		t.Errorf("peers %+v", p)
	}
	// The agent makes the fabric's DaemonSet and the webhook; it does not
	// run here, so none are there and no agent could say about fences.
	if info.Fabric.Installed || info.Webhook.Installed || info.Fences.Known {
		t.Errorf("fabric %+v, webhook %+v, fences %+v: want none", info.Fabric, info.Webhook, info.Fences)
	}
	if info.Client.Version == "" || !strings.HasPrefix(info.Cluster.Server, "https://") {
		t.Errorf("client %+v, cluster %+v", info.Client, info.Cluster)
	}

	code, out, errOut = flotilla("info", kc)
	out = oneSpace(out)
	for _, want := range []string{
		"Agent flotilla-system/flotilla-agent: ", "pod flotilla-agent-", " on gateway: ",
		"Fences unknown: no agent said", "Fabric none (no DaemonSet flotilla-system/flotilla-fabric",
		"Clusterset DNS Service flotilla-system/flotilla-clusterset-dns at ", "Peers 3: 1 Degraded, 2 Connected",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("info: exit %d, %q not in\n%s%s", code, want, out, errOut)
		}
	}
	code, out, _ = flotilla("info", kc, "-o", "yaml")
	var fromYAML installInfo
	if err := yaml.UnmarshalStrict([]byte(out), &fromYAML); code != 0 || err != nil || fromYAML.Peers.Total != 3 {
		t.Errorf("info -o yaml: exit %d, %v\n%s", code, err, out)
	}

	t.Run("refused, with the refused party's own token", func(t *testing.T) {
		nobody := serviceAccountKubeconfig(t, cp, "default", "nobody")
		code, out, errOut := flotilla("info", "--kubeconfig", nobody)
		out = oneSpace(out)
		// The witness that info got past each read: the refusals, named.
		for _, want := range []string{
			`Not read the agent's Deployment: deployments.apps "flotilla-agent" is forbidden: User "system:serviceaccount:default:nobody"`,
			`Not read peers: peers.flotilla.io is forbidden: User "system:serviceaccount:default:nobody"`,
			"Agent unknown (see below)",
		} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("info as nobody: exit %d, %q not in\n%s%s", code, want, out, errOut)
			}
		}
		if strings.Contains(out+errOut, "not installed") {
			t.Errorf("info as nobody claims Flotilla is not installed:\n%s%s", out, errOut)
		}
	})
}

// serviceAccountKubeconfig makes ServiceAccount ns/name and writes a
// kubeconfig holding a token of its own.
func serviceAccountKubeconfig(t *testing.T, cp *harness.ControlPlane, ns, name string) string {
	t.Helper()
	sas := cp.Client.CoreV1().ServiceAccounts(ns)
	if _, err := sas.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := sas.CreateToken(t.Context(), name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	cfg.AuthInfos = map[string]*clientcmdapi.AuthInfo{name: {Token: tr.Status.Token}}
	ctx.AuthInfo = name
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// oneSpace collapses the runs of spaces a table aligns its columns with.
func oneSpace(s string) string {
	return regexp.MustCompile(` {2,}`).ReplaceAllString(s, " ")
}

// The agent's /readyz?verbose, read back into checks: a reason keeps its
// own colons; what is not a check line is skipped.
func TestParseReadyz(t *testing.T) {
	page := "[+]discovery ok\n[-]fences failed: policy flotilla-tenant-fence: binding missing\n[+]kubernetes ok\nreadyz check failed\n"
	got := parseReadyz([]byte(page))
	want := []check{{Name: "discovery", OK: true}, {Name: "fences", Message: "policy flotilla-tenant-fence: binding missing"}, {Name: "kubernetes", OK: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseReadyz:\n%v\nwant\n%v", got, want)
	}
	if d := describeChecks(got); d != "fences failed: policy flotilla-tenant-fence: binding missing; 2 of 3 pass" {
		t.Errorf("describeChecks: %q", d)
	}
	if got := parseReadyz([]byte("ok")); len(got) != 0 {
		t.Errorf("parseReadyz(ok) = %v", got)
	}
}

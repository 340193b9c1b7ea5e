package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// clusterset.local without hand edits (docs/services.md, "DNS"): a's agent,
// given --coredns-forward and deploy/coredns-forward's rights, keeps a
// block forwarding the zone to its DNS Service in a's CoreDNS Corefile and
// nothing else; a pod of a resolves b's export through CoreDNS and is
// answered by b's pod, while echo.mcs.svc.cluster.local stays a's own
// name; reverse lookups through CoreDNS reach the agent for the views'
// addresses; the block comes back when someone removes it; the
// agent's own token may touch no other ConfigMap of kube-system; and with
// the flag off the agent takes its block out, leaving the Corefile byte
// for byte as it was.
func TestClustersetThroughCoreDNS(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"), Later: []int{0},
	})
	a, b := cs[0], cs[1]
	ctx := context.Background()
	corefile := func() string {
		t.Helper()
		cm, err := a.CP.Client.CoreV1().ConfigMaps(harness.DNSNamespace).Get(ctx, harness.DNSConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data["Corefile"]
	}
	before := corefile()
	mustKubectl(t, a.CP, "apply", "--server-side", "-k", filepath.Join("..", "..", "deploy", "coredns-forward"))
	a.InstallAgent(t, []string{"--coredns-forward=kube-system/coredns"})
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)

	svc, err := a.CP.Client.CoreV1().Services(federation.AgentNamespace).Get(ctx, federation.ClustersetDNSService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	forward := fmt.Sprintf("forward . %s:53\n", svc.Spec.ClusterIP)
	blockWritten := func() error {
		now := corefile()
		if !strings.HasPrefix(now, before) || !strings.Contains(now[len(before):], "clusterset.local:53 {") || !strings.Contains(now[len(before):], forward) {
			return fmt.Errorf("Corefile is %q, want %q and after it a block that forwards clusterset.local to %s", now, before, svc.Spec.ClusterIP)
		}
		return nil
	}
	t.Run("the agent writes its block after the Corefile, changing nothing of it", func(t *testing.T) {
		eventually.Within(t, 60*time.Second, "a's Corefile forwarding clusterset.local", blockWritten)
	})

	for _, cl := range cs {
		createNamespace(t, cl, "mcs")
	}
	echoSpec := testPod("echo", map[string]string{"kubernetes.io/hostname": b.Gateway.NodeName})
	echoSpec.Namespace = "mcs"
	createObject(t, b, echoSpec)
	createObject(t, b, serviceFor("echo", "mcs"))
	echo := waitPods(t, b, "mcs", "app=echo", 1, 90*time.Second, runningOn(b.Gateway.NodeName))[0]
	mustKubectlApply(t, b, exportManifest("echo", "mcs"))

	url := fmt.Sprintf("http://echo.mcs.svc.%s:%d/hostname", strings.TrimSuffix(mcs.Zone, "."), harness.TestServerHTTPPort)
	t.Run("a's pod resolves b's export through a's CoreDNS and b's pod answers", func(t *testing.T) {
		// The kubelet brings the changed Corefile into CoreDNS's pod at
		// its next sync of the pod (up to a minute); CoreDNS then reloads.
		eventually.Within(t, 150*time.Second, "a's pod GET "+url, func() error {
			out, err := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-get", url)
			if err != nil {
				// Which hop fails: the agent's DNS through its Service
				// without CoreDNS, and what CoreDNS logged.
				direct, derr := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-dns", svc.Spec.ClusterIP+":53", "-get", url)
				logs, _ := federation.Kubectl(a.CP, "-n", harness.DNSNamespace, "logs", "deploy/"+harness.DNSDeployment, "--tail=5")
				return fmt.Errorf("%v: %s\nthrough the agent's Service alone: %v: %s\nCoreDNS's last lines:\n%s", err, out, derr, direct, logs)
			}
			if got := strings.TrimSpace(out); got != echo.Name {
				return fmt.Errorf("%s answered by %q, want b's pod %s", url, got, echo.Name)
			}
			return nil
		})
	})

	t.Run("cluster.local stays local: no such name until a has its own Service echo, which then answers it", func(t *testing.T) {
		local := fmt.Sprintf("http://echo.mcs.svc.%s:%d/hostname", harness.ClusterDomain, harness.TestServerHTTPPort)
		// The witness that a imported b's echo and that CoreDNS answers
		// a's pod: the subtest before, by the clusterset name.
		if out, err := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-get", local); err == nil || !strings.Contains(out, "no such host") {
			t.Errorf("a's pod GET %s, a having no Service echo: %v %q, want no such host", local, err, out)
		}
		mine := testPod("echo-a", nil)
		mine.Namespace, mine.Labels["app"] = "mcs", "echo"
		createObject(t, a, mine)
		createObject(t, a, serviceFor("echo", "mcs"))
		waitPods(t, a, "mcs", "app=echo", 1, 90*time.Second, federation.PodReady)
		for _, x := range []struct{ url, want string }{{local, mine.Name}, {url, echo.Name}} {
			eventually.Within(t, 60*time.Second, "a's pod GET "+x.url, func() error {
				out, err := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-get", x.url)
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				if got := strings.TrimSpace(out); got != x.want {
					return fmt.Errorf("%s answered by %q, want %s", x.url, got, x.want)
				}
				return nil
			})
		}
	})

	t.Run("reverse lookups of b's exports give their clusterset names", func(t *testing.T) {
		reverseLookups(t, a, b, echo, svc.Spec.ClusterIP)
	})

	t.Run("a block someone removed comes back", func(t *testing.T) {
		cms := a.CP.Client.CoreV1().ConfigMaps(harness.DNSNamespace)
		cm, err := cms.Get(ctx, harness.DNSConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["Corefile"] = before
		removed, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 60*time.Second, "a's Corefile forwarding clusterset.local again", func() error {
			now, err := cms.Get(ctx, harness.DNSConfigMap, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if now.ResourceVersion == removed.ResourceVersion {
				return fmt.Errorf("the Corefile is still as the block's removal left it")
			}
			return blockWritten()
		})
	})

	t.Run("the agent's own token reaches CoreDNS's ConfigMap and no other of kube-system", func(t *testing.T) {
		agent := agentClient(t, a)
		// The witness that the token works: it reads CoreDNS's ConfigMap.
		if _, err := agent.CoreV1().ConfigMaps(harness.DNSNamespace).Get(ctx, harness.DNSConfigMap, metav1.GetOptions{}); err != nil {
			t.Fatalf("the agent's token reading %s/%s: %v", harness.DNSNamespace, harness.DNSConfigMap, err)
		}
		// A ConfigMap of kube-system's that is not CoreDNS's.
		other := "flotilla-test-other"
		createObject(t, a, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: other, Namespace: harness.DNSNamespace}, Data: map[string]string{"k": "v"}})
		if _, err := agent.CoreV1().ConfigMaps(harness.DNSNamespace).Get(ctx, other, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent's token reading ConfigMap %s/%s: %v, want Forbidden", harness.DNSNamespace, other, err)
		}
		patch := []byte(`{"data":{"x":"y"}}`)
		if _, err := agent.CoreV1().ConfigMaps(harness.DNSNamespace).Patch(ctx, other, types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent's token patching ConfigMap %s/%s: %v, want Forbidden", harness.DNSNamespace, other, err)
		}
		if _, err := agent.CoreV1().ConfigMaps(harness.DNSNamespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent's token listing kube-system's ConfigMaps: %v, want Forbidden", err)
		}
		if cm, err := a.CP.Client.CoreV1().ConfigMaps(harness.DNSNamespace).Get(ctx, other, metav1.GetOptions{}); err != nil || len(cm.Data) != 1 || cm.Data["k"] != "v" {
			t.Errorf("ConfigMap %s after the refusals: %v, %v, want it as created", other, err, cm.Data)
		}
	})

	t.Run("with the flag off the agent takes its block out: the Corefile as before, byte for byte", func(t *testing.T) {
		a.InstallAgent(t, nil)
		eventually.Within(t, 60*time.Second, "a's Corefile as before", func() error {
			if now := corefile(); now != before {
				return fmt.Errorf("Corefile is %q, want %q", now, before)
			}
			return nil
		})
		// The rest of the uninstall docs/install.md gives: the opt-in's
		// rights and fence go; the harness checks nothing is left.
		mustKubectl(t, a.CP, "delete", "-k", filepath.Join("..", "..", "deploy", "coredns-forward"), "--ignore-not-found")
	})
}

// agentClient is a client with a token of c's agent's own account.
func agentClient(t *testing.T, c *federation.NodeCluster) kubernetes.Interface {
	t.Helper()
	expiry := int64(600)
	tr, err := c.CP.Client.CoreV1().ServiceAccounts(federation.AgentNamespace).CreateToken(context.Background(), "flotilla-agent",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s's agent: %v", c.Name, err)
	}
	cfg := rest.AnonymousClientConfig(c.CP.Config)
	cfg.BearerToken = tr.Status.Token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// reverseLookups checks the PTR records a's pod gets. The ClusterSetIP
// of b's export echo, asked of a's agent's DNS Service, answers echo's
// clusterset name; asked through a's CoreDNS, the derived Service's
// cluster-local name (CoreDNS's kubernetes plugin holds the Service
// range's reverse zone). The address of echo's pod in a headless export
// db, asked through a's CoreDNS (the reverse zones of the views
// forwarded to the agent), answers a name of db's that resolves back to
// it, in b's cluster, and reaches that pod.
func reverseLookups(t *testing.T, a, b *federation.NodeCluster, echo corev1.Pod, dnsIP string) {
	t.Helper()
	zone := strings.TrimSuffix(mcs.Zone, ".")
	// reverse asks the agent's Service, or with dnsIP "" the pod's
	// cluster DNS.
	reverse := func(addr, dnsIP string) ([]string, error) {
		args := []string{"exec", a.Web.Name, "--", "/testserver", "-lookup-addr", addr}
		if dnsIP != "" {
			args = append(args, "-dns", dnsIP+":53")
		}
		out, err := federation.Kubectl(a.CP, args...)
		if err != nil {
			return nil, fmt.Errorf("%v: %s", err, out)
		}
		return strings.Fields(out), nil
	}
	imp := waitServiceImport(t, a, "mcs", "echo", 60*time.Second, func(si mcsv1alpha1.ServiceImport) error {
		if len(si.Spec.IPs) != 1 {
			return fmt.Errorf("ips %v, want one ClusterSetIP", si.Spec.IPs)
		}
		return nil
	})
	for _, via := range []struct{ dns, want string }{
		{dnsIP, "echo.mcs.svc." + zone + "."},
		{"", mcs.DerivedServiceName("echo") + ".mcs.svc." + harness.ClusterDomain + "."},
	} {
		eventually.Within(t, 30*time.Second, "a's reverse lookup of the ClusterSetIP "+imp.Spec.IPs[0]+" asking "+cmp.Or(via.dns, "CoreDNS"), func() error {
			names, err := reverse(imp.Spec.IPs[0], via.dns)
			if err != nil {
				return err
			}
			if len(names) != 1 || names[0] != via.want {
				return fmt.Errorf("names %q, want %q", names, via.want)
			}
			return nil
		})
	}

	db := serviceFor("db", "mcs")
	db.Spec.Selector = map[string]string{"app": "echo"}
	db.Spec.ClusterIP = corev1.ClusterIPNone
	createObject(t, b, db)
	mustKubectlApply(t, b, exportManifest("db", "mcs"))
	bID := peerID(t, a, b.Name)
	addr := federation.ViewOf(t, a.Cluster, b.Cluster, netip.MustParseAddr(echo.Status.PodIP)).String()
	var name string
	// The kubelet brings a Corefile the agent rewrote for new views into
	// CoreDNS's pod at its next sync of the pod (up to a minute).
	eventually.Within(t, 150*time.Second, "a's reverse lookup of echo's pod "+addr+" through CoreDNS", func() error {
		names, err := reverse(addr, "")
		if err != nil {
			return err
		}
		if len(names) != 1 || !strings.HasSuffix(names[0], "."+bID+".db.mcs.svc."+zone+".") || strings.Count(names[0], ".") != 7 {
			return fmt.Errorf("names %q, want one <host>.%s.db.mcs.svc.%s.", names, bID, zone)
		}
		name = names[0]
		return nil
	})
	// The name leads back: through a's CoreDNS to echo's pod in b.
	url := fmt.Sprintf("http://%s:%d/hostname", strings.TrimSuffix(name, "."), harness.TestServerHTTPPort)
	eventually.Within(t, 30*time.Second, "a's pod GET "+url, func() error {
		out, err := federation.Kubectl(a.CP, "exec", a.Web.Name, "--", "/testserver", "-get", url)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if got := strings.TrimSpace(out); got != echo.Name {
			return fmt.Errorf("%s answered by %q, want b's pod %s", url, got, echo.Name)
		}
		return nil
	})
}

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// From a ServiceExport created in b to the first connection that a pod of
// a, asking its cluster DNS (real CoreDNS, forwarding clusterset.local to
// a's agent as docs/services.md tells an operator), makes to the exported
// Service's pod in b, by name. Two clusters of real nodes, the agents as
// pods, the export crossing by their gossip. The pod of a asks from
// before the export, every 50 ms, as a client waiting for the name would;
// the time is the pod's clock (the machine's) when the answer came, which
// b's pod gave (its UID). A second client of the same pod asks a's
// agent's DNS Service directly, without CoreDNS and its cache: the
// difference is what CoreDNS's cache of the negative answers (at most the
// zone's 5 s) adds. Each round exports a new Service and takes the last
// one away, waiting until a's import is gone. Run with -benchtime
// 10x for a median of 10 (make bench does). Target: <= 1 s median.
func BenchmarkExportToDNSConnection(b *testing.B) {
	harness.Require(b, harness.NeedsNodes...)
	env := harness.New(b)
	cs := federation.OnNodes(b, env, federation.NodeOptions{Clusters: 2, PodCIDR: netip.MustParsePrefix("10.0.0.0/16")})
	a, p := cs[0], cs[1]
	federation.WaitPhases(b, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	a.ForwardClusterset(b)
	ctx := context.Background()
	for _, c := range cs {
		if _, err := c.CP.Client.CoreV1().Namespaces().Create(ctx, namespaceNamed("mcs"), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	echo := testPod("echo", map[string]string{"kubernetes.io/hostname": p.Gateway.NodeName})
	echo.Namespace = "mcs"
	if _, err := p.CP.Client.CoreV1().Pods("mcs").Create(ctx, echo, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var pod corev1.Pod
	eventually.Within(b, 90*time.Second, "b's echo pod Ready", func() error {
		got, err := p.CP.Client.CoreV1().Pods("mcs").Get(ctx, "echo", metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = *got
		return federation.PodReady(pod)
	})
	dnsSvc, err := a.CP.Client.CoreV1().Services(federation.AgentNamespace).Get(ctx, federation.ClustersetDNSService, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	direct := dnsSvc.Spec.ClusterIP + ":53"
	exports := mcsClient(b, p)
	// The first export, untimed: the kubelet brings the changed Corefile
	// into CoreDNS's pod at its next sync of the pod (up to a minute).
	if _, _, err := exportOnce(b, a, p, exports, pod, "warm", direct, 150*time.Second); err != nil {
		b.Fatal(err)
	}
	var took, tookDirect []time.Duration
	for i := 0; b.Loop(); i++ {
		d, dd, err := exportOnce(b, a, p, exports, pod, fmt.Sprintf("echo%d", i), direct, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		took, tookDirect = append(took, d), append(tookDirect, dd)
	}
	s, sd := spreadOf(took), spreadOf(tookDirect)
	b.ReportMetric(ms(s.median), "ms-median")
	b.ReportMetric(ms(s.min), "ms-min")
	b.ReportMetric(ms(s.max), "ms-max")
	b.ReportMetric(ms(sd.median), "ms-agent-dns-median")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stdout, "BenchmarkExportToDNSConnection: export to the first DNS-resolved connection from a pod in another cluster, through CoreDNS %s; asking the agent's DNS Service directly %s (ms: median, min, max, rounds)\n", s, sd)
}

// exportOnce exports a new Service name of p (selecting pod) and returns
// how long after the export a's pod first reached pod by the name
// name.mcs.svc.clusterset.local, through a's cluster DNS and asking the
// agent's DNS (direct) alone; then it takes the Service away and waits
// until a's import of it is gone.
func exportOnce(b *testing.B, a, p *federation.NodeCluster, exports client.Client, pod corev1.Pod, name, direct string, timeout time.Duration) (time.Duration, time.Duration, error) {
	b.Helper()
	ctx := context.Background()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mcs"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"}, Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: harness.TestServerHTTPPort, TargetPort: intstr.FromInt32(harness.TestServerHTTPPort),
		}}},
	}
	if _, err := p.CP.Client.CoreV1().Services("mcs").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return 0, 0, err
	}
	url := fmt.Sprintf("http://%s.mcs.svc.%s:%d/", name, strings.TrimSuffix(mcs.Zone, "."), harness.TestServerHTTPPort)
	type answer struct {
		out string
		err error
	}
	ask := func(extra ...string) chan answer {
		done := make(chan answer, 1)
		go func() {
			args := append([]string{"exec", a.Web.Name, "--", "/testserver", "-get", url, "-wait", timeout.String()}, extra...)
			out, err := federation.KubectlTimeout(a.CP, timeout+10*time.Second, args...)
			done <- answer{out, err}
		}()
		return done
	}
	viaCoreDNS, viaAgent := ask(), ask("-dns", direct)
	// The pod asks before the export: its first queries are answered
	// NXDOMAIN, as they would be for a client that waits for the name.
	time.Sleep(time.Second)
	export := &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mcs"}}
	start := time.Now()
	if err := exports.Create(ctx, export); err != nil {
		return 0, 0, err
	}
	var took [2]time.Duration
	for i, done := range []chan answer{viaCoreDNS, viaAgent} {
		got := <-done
		if got.err != nil {
			return 0, 0, fmt.Errorf("a's pod GET %s: %v", url, got.err)
		}
		at, err := answeredBy(got.out, pod)
		if err != nil {
			return 0, 0, fmt.Errorf("a's pod GET %s: %v", url, err)
		}
		took[i] = at.Sub(start)
	}
	if err := exports.Delete(ctx, export); err != nil {
		return 0, 0, err
	}
	if err := p.CP.Client.CoreV1().Services("mcs").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, err
	}
	imports := mcsClient(b, a)
	eventually.Within(b, 60*time.Second, "a's import of "+name+" gone", func() error {
		err := imports.Get(ctx, client.ObjectKey{Namespace: "mcs", Name: name}, &mcsv1alpha1.ServiceImport{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("ServiceImport mcs/%s still on a (%v)", name, err)
	})
	return took[0], took[1], nil
}

// answeredBy reads the test server's "-wait" output: when the answer
// came, and that pod (its name and UID) gave it.
func answeredBy(out string, pod corev1.Pod) (time.Time, error) {
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		fields[k] = v
	}
	if fields["host"] != pod.Name || fields["uid"] != string(pod.UID) {
		return time.Time{}, fmt.Errorf("answered by %q (uid %q), want pod %s (uid %s): %q", fields["host"], fields["uid"], pod.Name, pod.UID, out)
	}
	ns, err := strconv.ParseInt(fields["at"], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("no time of the answer in %q", out)
	}
	return time.Unix(0, ns), nil
}

// mcsClient reads and writes c's MCS objects.
func mcsClient(t testing.TB, c *federation.NodeCluster) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := mcsv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.CP.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

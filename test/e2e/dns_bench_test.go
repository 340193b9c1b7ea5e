package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
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
// zone's negative TTL, 1 s) adds. A watch on a's API server tells when
// the ServiceImport and its ClusterSetIP appeared, printed beside. Each
// round exports a new Service and takes the last one away, waiting until
// a's import is gone. Run with -benchtime 10x for a median of 10 (make
// bench does). Target: <= 1 s median.
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
	if _, err := exportOnce(b, a, p, exports, pod, "warm", direct, 150*time.Second); err != nil {
		b.Fatal(err)
	}
	var took, tookDirect, imported, ip, lastTry []time.Duration
	for i := 0; b.Loop(); i++ {
		r, err := exportOnce(b, a, p, exports, pod, fmt.Sprintf("echo%d", i), direct, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		took, tookDirect = append(took, r.coreDNS), append(tookDirect, r.direct)
		lastTry = append(lastTry, r.lastTry)
		// A step the watch missed is left out of its figures.
		if r.imported >= 0 {
			imported = append(imported, r.imported)
		}
		if r.ip >= 0 {
			ip = append(ip, r.ip)
		}
	}
	s, sd := spreadOf(took), spreadOf(tookDirect)
	b.ReportMetric(ms(s.median), "ms-median")
	b.ReportMetric(ms(s.min), "ms-min")
	b.ReportMetric(ms(s.max), "ms-max")
	b.ReportMetric(ms(sd.median), "ms-agent-dns-median")
	b.ReportMetric(0, "ns/op")
	fmt.Fprintf(os.Stdout, "BenchmarkExportToDNSConnection: export to the first DNS-resolved connection from a pod in another cluster, through CoreDNS %s; asking the agent's DNS Service directly %s (ms: median, min, max, rounds)\n", s, sd)
	fmt.Fprintf(os.Stdout, "BenchmarkExportToDNSConnection: after the export, seen on a's API server: ServiceImport %s; its ClusterSetIP %s (ms: median, min, max, rounds seen)\n",
		spreadOf(imported), spreadOf(ip))
	// A try that took about a second had its first SYN dropped: the name
	// answered before the node's kube-proxy had programmed the ClusterIP.
	fmt.Fprintf(os.Stdout, "BenchmarkExportToDNSConnection: the answered GET through CoreDNS took %s (ms: median, min, max, rounds)\n", spreadOf(lastTry))
}

// exportRound is one export's times after the export was created: the
// first connection through CoreDNS and asking the agent's DNS directly,
// and the import's steps as a watch on a's API server saw them.
type exportRound struct {
	coreDNS, direct              time.Duration
	lastTry                      time.Duration // of the answered GET through CoreDNS
	imported, ip, derived, slice time.Duration
}

// exportOnce exports a new Service name of p (selecting pod) and returns
// how long after the export a's pod first reached pod by the name
// name.mcs.svc.clusterset.local, through a's cluster DNS and asking the
// agent's DNS (direct) alone; then it takes the Service away and waits
// until a's import of it is gone.
func exportOnce(b *testing.B, a, p *federation.NodeCluster, exports client.Client, pod corev1.Pod, name, direct string, timeout time.Duration) (exportRound, error) {
	b.Helper()
	ctx := context.Background()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mcs"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"}, Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: harness.TestServerHTTPPort, TargetPort: intstr.FromInt32(harness.TestServerHTTPPort),
		}}},
	}
	if _, err := p.CP.Client.CoreV1().Services("mcs").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return exportRound{}, err
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
	stopWatch := watchImport(b, a, name)
	export := &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mcs"}}
	start := time.Now()
	if err := exports.Create(ctx, export); err != nil {
		stopWatch()
		return exportRound{}, err
	}
	var took [2]time.Duration
	var lastTry time.Duration
	for i, done := range []chan answer{viaCoreDNS, viaAgent} {
		got := <-done
		if got.err != nil {
			stopWatch()
			return exportRound{}, fmt.Errorf("a's pod GET %s: %v", url, got.err)
		}
		at, err := answeredBy(got.out, pod)
		if err != nil {
			stopWatch()
			return exportRound{}, fmt.Errorf("a's pod GET %s: %v", url, err)
		}
		took[i] = at.Sub(start)
		if i == 0 {
			lastTry = lastTryOf(got.out)
		}
	}
	steps := stopWatch()
	since := func(t time.Time) time.Duration {
		if t.IsZero() {
			return -1
		}
		return t.Sub(start)
	}
	r := exportRound{coreDNS: took[0], direct: took[1], lastTry: lastTry,
		imported: since(steps.imported), ip: since(steps.ip)}
	if err := exports.Delete(ctx, export); err != nil {
		return exportRound{}, err
	}
	if err := p.CP.Client.CoreV1().Services("mcs").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return exportRound{}, err
	}
	imports := mcsClient(b, a)
	eventually.Within(b, 60*time.Second, "a's import of "+name+" gone", func() error {
		err := imports.Get(ctx, client.ObjectKey{Namespace: "mcs", Name: name}, &mcsv1alpha1.ServiceImport{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("ServiceImport mcs/%s still on a (%v)", name, err)
	})
	return r, nil
}

// lastTryOf reads how long the test server's answered GET took (its
// "last-try" line); zero when the line is missing.
func lastTryOf(out string) time.Duration {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "last-try "); ok {
			ns, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(ns)
		}
	}
	return 0
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

// importSteps are when a's importer's writes for one export were first
// seen by a watch on a's API server, after the export: the ServiceImport,
// and its ClusterSetIP (from then on a's agent answers the name; the
// endpoints are written before it). Zero: not seen.
type importSteps struct {
	imported, ip time.Time
}

// watchImport watches a for the import of name in the namespace mcs
// until stop is called, which returns when each step was first seen.
func watchImport(b *testing.B, a *federation.NodeCluster, name string) (stop func() importSteps) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := runtime.NewScheme()
	if err := mcsv1alpha1.AddToScheme(s); err != nil {
		b.Fatal(err)
	}
	c, err := client.NewWithWatch(a.CP.Config, client.Options{Scheme: s})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	// firstSeen sets *at when the watch of list first sends an object
	// that seen accepts.
	firstSeen := func(at *time.Time, list client.ObjectList, seen func(runtime.Object) bool, opts ...client.ListOption) {
		w, err := c.Watch(ctx, list, append(opts, client.InNamespace("mcs"))...)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					if ev.Object != nil && seen(ev.Object) {
						*at = time.Now()
						return
					}
				}
			}
		})
	}
	var st importSteps
	byName := func(n string) client.ListOption { return client.MatchingFields{"metadata.name": n} }
	firstSeen(&st.imported, &mcsv1alpha1.ServiceImportList{}, func(o runtime.Object) bool {
		_, ok := o.(*mcsv1alpha1.ServiceImport)
		return ok
	}, byName(name))
	firstSeen(&st.ip, &mcsv1alpha1.ServiceImportList{}, func(o runtime.Object) bool {
		si, ok := o.(*mcsv1alpha1.ServiceImport)
		return ok && len(si.Spec.IPs) > 0
	}, byName(name))
	return func() importSteps {
		cancel()
		wg.Wait()
		return st
	}
}

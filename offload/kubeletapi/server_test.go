package kubeletapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/internal/syncbuf"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/internal/certs"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	"github.com/flotilla-io/flotilla/offload/remote"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// kubeletWorld is a provider with a real node running a test server pod
// for a granted consumer, and the consumer with the virtual node of that
// provider, a pod bound to it, and the Server serving the node.
type kubeletWorld struct {
	prov, cons *harness.ControlPlane
	node       *harness.Node // the provider's
	provider   string        // the provider's cluster ID
	tenant     string        // the consumer's namespace there
	token      string        // the consumer's credential there
	tenants    *tenancy.Tenants
	consumer   string                   // the consumer's cluster ID at the provider
	creds      *offloadtest.Credentials // what the kubelet API holds of the provider
	remote     kubernetes.Interface
	local      client.Client // admin of the consumer

	ca   *certs.CertAuthority
	addr netip.AddrPort // the kubelet API's, the virtual node's
	api  *Server
	stop func() error // stops api, returns what its Run did
	logs *syncbuf.Buffer
	reg  *prometheus.Registry
}

// Where the consumer's pods are, in namespace appsNS, offloaded to the
// provider; kubeletAPIPod runs there.
const (
	appsNS        = "apps"
	kubeletAPIPod = "web"
)

// TestKubeletAPI runs kubectl logs, exec, port-forward and attach on an
// offloaded pod through the consumer's API server, which calls the
// Server as a kubelet; it forwards to the provider's API server and on to
// the real kubelet of the node the pod runs on. The consumer's API server
// verifies the Server's serving certificate against its CA and the
// address the virtual node registers.
func TestKubeletAPI(t *testing.T) {
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	ca, err := certs.NewCA("test", time.Now(), DefaultCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	cps := env.ControlPlanesEach(
		harness.ControlPlaneOptions{PodCIDR: netip.MustParsePrefix("10.244.0.0/16")},
		harness.ControlPlaneOptions{KubeletCA: ca.PEM()},
	)
	w := &kubeletWorld{prov: cps[0], cons: cps[1], provider: offloadtest.NewConsumer(t), ca: ca, logs: &syncbuf.Buffer{}, reg: prometheus.NewRegistry()}
	w.node = w.prov.StartNode("n1", harness.NodeOptions{})
	w.grant(t)
	w.virtualNode(t)
	w.start(t)
	w.runWeb(t)

	t.Run("Logs", w.testLogs)
	t.Run("LogsFollow", w.testLogsFollow)
	t.Run("Exec", w.testExec)
	t.Run("PortForward", w.testPortForward)
	t.Run("Attach", w.testAttach)
	t.Run("Refusals", w.testRefusals)
	t.Run("ClientCAWatched", w.testClientCAWatched)
	t.Run("NoCredentialInLogs", w.testNoCredentialInLogs)
	t.Run("Metrics", w.testMetrics)
	t.Run("StopEndsStreams", w.testStopEndsStreams)
	t.Run("Restart", w.testRestart)
	t.Run("CredentialRotated", w.testCredentialRotated)
	if t.Failed() {
		t.Logf("kubelet API log:\n%s", w.logs.String())
	}
}

// grant installs deploy/'s RBAC and admission on the provider and makes
// the consumer's tenant there with a real token, as a provider's grant
// does; the consumer's pods go in the tenant namespace.
func (w *kubeletWorld) grant(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	for _, f := range []string{"namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "admission.yaml"} {
		if _, err := federation.Kubectl(w.prov, "apply", "--server-side", "-f", offloadtest.DeployFile(f)); err != nil {
			t.Fatal(err)
		}
	}
	tenants, err := tenancy.NewTenants(tenancy.TenantsConfig{Config: w.prov.Config, Client: w.prov.Client, Audience: offloadtest.AcceptedAudience})
	if err != nil {
		t.Fatal(err)
	}
	consumer := offloadtest.NewConsumer(t)
	tenant, err := tenants.Ensure(ctx, consumer, grant.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tenants.Issue(ctx, consumer)
	if err != nil {
		t.Fatal(err)
	}
	w.tenant, w.token = tenant.Namespace, tok.Value.Reveal()
	w.tenants, w.consumer = tenants, consumer
	w.remote = kubernetes.NewForConfigOrDie(w.credential())
}

// credential is the consumer's REST config of the provider.
func (w *kubeletWorld) credential() *rest.Config {
	return &rest.Config{Host: w.prov.Config.Host, BearerToken: w.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: w.prov.Config.CAData}, Timeout: 10 * time.Second}
}

// virtualNode makes on the consumer what the other parts of offloading
// would: the virtual node (its address and port the Server's, both
// picked here), the namespace offloaded Ready to the provider's tenant.
func (w *kubeletWorld) virtualNode(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	offloadtest.MustApplyCRDs(t, w.cons.Config)
	w.local = offloadtest.AdminClient(t, w.cons)
	addr := freeLoopback(t)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: offload.VirtualNodeName(w.provider), Labels: map[string]string{
			offload.LabelVirtualNode: "true", offload.LabelClusterID: w.provider}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: offload.TaintVirtualNode, Value: "true", Effect: corev1.TaintEffectNoExecute}}},
	}
	nodes := w.cons.Client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller manager writes the node too (its taints).
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.Addr().String()}}
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(addr.Port())
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	w.offload(t, appsNS)
	// The authority the consumer's API server was started to trust, in
	// the Secret the kubelet API keeps its CAs in, as an operator who
	// brings the CA would put it.
	seedKubeletCA(t, w.cons, w.ca)
	w.addr = addr
	w.api = w.newAPI(t)
}

// newAPI is the kubelet API of the virtual node, as the agent makes it
// at each start; its metrics go to a registry of its own, w.reg.
func (w *kubeletWorld) newAPI(t *testing.T) *Server {
	t.Helper()
	w.reg = prometheus.NewRegistry()
	api, err := NewServer(Config{
		Client: w.cons.Client, Credentials: w.credentials(1), Address: w.addr.Addr(), Port: w.addr.Port(), AgentNamespace: testAgentNamespace,
		Logger: slog.New(slog.NewJSONHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug})), Metrics: w.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// credentials hold the provider's grant of serial with w.token, as
// w.creds.
func (w *kubeletWorld) credentials(serial uint64) remote.Credentials {
	w.creds = &offloadtest.Credentials{Held: map[string]remote.ProviderCredential{w.provider: w.providerCredential(serial)}}
	return w.creds
}

func (w *kubeletWorld) providerCredential(serial uint64) remote.ProviderCredential {
	return remote.ProviderCredential{
		Config: w.credential(),
		Grant:  grant.Grant{Provider: w.provider, Serial: serial, Server: w.prov.Config.Host, Namespace: w.tenant, ExpiresAt: time.Now().Add(time.Hour)},
	}
}

// offload makes namespace ns and its NamespaceOffload, Ready on the
// provider in the tenant namespace.
func (w *kubeletWorld) offload(t *testing.T, ns string) {
	t.Helper()
	ctx := t.Context()
	if err := w.local.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	o := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "offload"}}
	if err := w.local.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	o.Status.Clusters = []v1alpha1.ClusterOffload{{ClusterID: w.provider, ClusterName: "provider", RemoteNamespace: w.tenant}}
	meta.SetStatusCondition(&o.Status.Clusters[0].Conditions, metav1.Condition{Type: offload.ConditionReady, Status: metav1.ConditionTrue, Reason: "Created", Message: "test"})
	if err := w.local.Status().Update(ctx, o); err != nil {
		t.Fatal(err)
	}
}

// start runs the Server until the test ends and waits until it
// answers.
func (w *kubeletWorld) start(t *testing.T) {
	t.Helper()
	w.stop = runKubeletAPI(t, w.api)
}

// runKubeletAPI runs api until the test ends, or stop, and returns once
// it serves; stop returns what Run returned.
func runKubeletAPI(t *testing.T, api *Server) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("kubeletapi.Server.Run: %v", err)
		}
	})
	eventually.Within(t, 30*time.Second, "the kubelet API serving on "+api.Addr().String(), func() error {
		select {
		case err := <-done:
			t.Fatalf("kubeletapi.Server.Run returned early: %v", err)
		default:
		}
		_, err := servedLeaf(api)
		return err
	})
	return stop
}

// runWeb runs the test server pod on the consumer, bound to the virtual
// node, and its counterpart on the provider, made with the consumer's
// credential as the pods part of offloading would, and waits until it is
// Ready on the real node. A pod of the same name stands for another one:
// an earlier pod being replaced.
func (w *kubeletWorld) runWeb(t *testing.T) {
	t.Helper()
	for _, name := range []string{kubeletAPIPod, "stale"} {
		local := w.localPod(t, appsNS, name, offload.VirtualNodeName(w.provider))
		origin := appsNS + "/" + name + "/" + string(local.UID)
		if name == "stale" {
			origin = appsNS + "/" + name + "/0a1b2c3d-earlier-pod"
		}
		remote := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{offload.AnnotationOrigin: origin}},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{
					Name: "server", Image: harness.TestServerImage, ImagePullPolicy: corev1.PullNever,
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(harness.TestServerTCPPort)}},
						PeriodSeconds: 1,
					},
				}},
			},
		}
		harness.Restricted(&remote.Spec)
		if name == "stale" {
			// Never scheduled: only its name and origin matter.
			remote.Spec.NodeSelector = map[string]string{"test.flotilla.io/nowhere": "true"}
		}
		if _, err := w.remote.CoreV1().Pods(w.tenant).Create(t.Context(), remote, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the consumer creates pod %s on the provider: %v", name, err)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		p, err := w.prov.Client.CoreV1().Pods(w.tenant).Get(t.Context(), kubeletAPIPod, metav1.GetOptions{})
		if err == nil {
			err = federation.PodReady(*p)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not Ready on the provider's node within 90 s: %v\nkubelet:\n%s", kubeletAPIPod, err, tailLines(w.node.Logs("kubelet"), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.reflectRunning(t, kubeletAPIPod)
}

// reflectRunning says on the consumer that pod name runs, as the pods
// part of offloading reflects it (kubectl port-forward wants it Running).
func (w *kubeletWorld) reflectRunning(t *testing.T, name string) {
	t.Helper()
	pods := w.cons.Client.CoreV1().Pods(appsNS)
	p, err := pods.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "server", Image: harness.TestServerImage, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
	}}
	if _, err := pods.UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// localPod creates a pod in the consumer bound to node ("" : unbound).
func (w *kubeletWorld) localPod(t *testing.T, ns, name, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: *harness.Restricted(&corev1.PodSpec{
			NodeName:    node,
			Tolerations: []corev1.Toleration{{Key: offload.TaintVirtualNode, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			Containers:  []corev1.Container{{Name: "server", Image: harness.TestServerImage}},
		}),
	}
	created, err := w.cons.Client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s on the consumer: %v", ns, name, err)
	}
	return created
}

// kubectl runs kubectl as the consumer's admin, through its API server.
func (w *kubeletWorld) kubectl(args ...string) (string, error) {
	return federation.Kubectl(w.cons, append([]string{"-n", appsNS}, args...)...)
}

// 1. kubectl logs shows the remote container's log, with the options
// passed on.
func (w *kubeletWorld) testLogs(t *testing.T) {
	out, err := w.kubectl("logs", kubeletAPIPod)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, ": TCP on") || !strings.Contains(out, ": HTTP on") {
		t.Fatalf("kubectl logs: %q, want the test server's start lines", out)
	}
	out, err = w.kubectl("logs", kubeletAPIPod, "--tail=1", "--timestamps")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 1 {
		t.Errorf("kubectl logs --tail=1: %d lines: %q", len(lines), out)
	}
	stamp, _, _ := strings.Cut(lines[0], " ")
	if _, err := time.Parse(time.RFC3339Nano, stamp); err != nil {
		t.Errorf("kubectl logs --timestamps: %q does not start with a timestamp: %v", lines[0], err)
	}
	out, err = w.kubectl("logs", kubeletAPIPod, "--limit-bytes=7")
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 7 {
		t.Errorf("kubectl logs --limit-bytes=7: %d bytes: %q", len(out), out)
	}
}

// 2. kubectl logs -f streams each line as the container writes it.
func (w *kubeletWorld) testLogsFollow(t *testing.T) {
	// The last line so far comes first: then the stream is open, and the
	// next line the server logs must follow.
	lines := w.follow(t)
	if _, err := w.kubectl("exec", kubeletAPIPod, "--", "/testserver", "-get", "http://127.0.0.1:8080/hostname"); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-lines:
		if !strings.Contains(line, "http /hostname from 127.0.0.1") {
			t.Errorf("kubectl logs -f: %q, want the request just made", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("kubectl logs -f: no line within 30 s of the request")
	}
}

// 3. kubectl exec runs in the remote container: its output, and its exit
// code.
func (w *kubeletWorld) testExec(t *testing.T) {
	out, err := w.kubectl("exec", kubeletAPIPod, "--", "/testserver", "-get", "http://127.0.0.1:8080/hostname")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != kubeletAPIPod {
		t.Errorf("kubectl exec: %q, want the pod's hostname %s", out, kubeletAPIPod)
	}
	out, err = w.kubectl("exec", kubeletAPIPod, "--", "/testserver", "-get", "http://127.0.0.1:1/")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(out, "connection refused") || !strings.Contains(out, "command terminated with exit code 1") {
		t.Errorf("kubectl exec of a failing command: %v: %q, want its error and exit code 1", err, out)
	}
	// Into a container the pod does not have: the consumer's API server
	// says so before calling any kubelet.
	if out, err := w.kubectl("exec", kubeletAPIPod, "-c", "nope", "--", "/testserver"); err == nil || !strings.Contains(out, "nope") {
		t.Errorf("kubectl exec -c nope: %v: %q", err, out)
	}
}

// 4. kubectl port-forward reaches the remote container's port.
func (w *kubeletWorld) testPortForward(t *testing.T) {
	w.portForward(t)
}

// portForward runs kubectl port-forward to the test server's HTTP port,
// checks that a request through it is answered by the remote container,
// and returns kubectl's output from then on.
func (w *kubeletWorld) portForward(t *testing.T) <-chan string {
	t.Helper()
	lines := w.background(t, "port-forward", "pod/"+kubeletAPIPod, ":"+fmt.Sprint(harness.TestServerHTTPPort))
	var port string
	forwarding := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)
	select {
	case line := <-lines:
		m := forwarding.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("kubectl port-forward: %q", line)
		}
		port = m[1]
	case <-time.After(30 * time.Second):
		t.Fatal("kubectl port-forward: nothing within 30 s")
	}
	resp, err := http.Get("http://127.0.0.1:" + port + "/hostname")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if strings.TrimSpace(string(body)) != kubeletAPIPod {
		t.Errorf("GET /hostname through port-forward: %s %q", resp.Status, body)
	}
	return lines
}

// 5. kubectl attach streams what the remote container writes from then
// on. Nothing says when it is attached: the test makes the server log a
// line until one comes through.
func (w *kubeletWorld) testAttach(t *testing.T) {
	lines := w.background(t, "attach", kubeletAPIPod)
	eventually.Within(t, 30*time.Second, "a line through kubectl attach", func() error {
		if _, err := w.kubectl("exec", kubeletAPIPod, "--", "/testserver", "-get", "http://127.0.0.1:8080/peer"); err != nil {
			return err
		}
		deadline := time.After(time.Second)
		for {
			select {
			case line, open := <-lines:
				if !open {
					t.Fatal("kubectl attach ended")
				}
				if strings.Contains(line, "http /peer from 127.0.0.1") {
					return nil
				}
			case <-deadline:
				return errors.New("nothing yet")
			}
		}
	})
}

// follow runs kubectl logs -f and returns its output once the stream is
// open: after the last line so far.
func (w *kubeletWorld) follow(t *testing.T) <-chan string {
	t.Helper()
	lines := w.background(t, "logs", "-f", "--tail=1", kubeletAPIPod)
	select {
	case line := <-lines:
		if line == "" {
			t.Fatal("kubectl logs -f ended before its first line")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("kubectl logs -f: nothing within 30 s")
	}
	return lines
}

// background runs kubectl until the test ends and hands over its output
// line by line, closing the channel when kubectl has closed its output
// (exited).
func (w *kubeletWorld) background(t *testing.T, args ...string) <-chan string {
	t.Helper()
	argv := append([]string{"--kubeconfig", w.cons.Kubeconfig, "-n", appsNS}, args...)
	cmd := exec.Command(federation.KubectlPath(), argv...)
	// Both outputs: kubectl attach writes the container's stderr to its
	// own.
	r, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = wr, wr
	err = cmd.Start()
	wr.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	var wg sync.WaitGroup
	var all syncbuf.Buffer
	wg.Go(func() {
		defer close(lines)
		s := bufio.NewScanner(r)
		for s.Scan() {
			fmt.Fprintln(&all, s.Text())
			select {
			case lines <- s.Text():
			default:
			}
		}
	})
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		wg.Wait()
		r.Close()
		if t.Failed() {
			t.Logf("kubectl %s:\n%s", strings.Join(args, " "), all.String())
		}
	})
	return lines
}

// 6. What a kubelet refuses, refused: callers it cannot authenticate
// (401), callers the consumer's cluster does not allow nodes/proxy, or
// not with the verb of the method (403), pods that are not offloaded or
// not there (404), other routes (404). None of the caller's headers go
// on to the provider.
func (w *kubeletWorld) testRefusals(t *testing.T) {
	admin, err := tls.X509KeyPair(w.cons.Config.CertData, w.cons.Config.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA("test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	stranger := clientCertOf(t, other, "flotilla-test-admin", "system:masters")
	// Signed by the consumer's own CA (a CertificateSigningRequest): alice
	// may do nothing, bob GET the kubelet API of every node.
	alice := clusterClientCert(t, w.cons, "alice")
	bob := clusterClientCert(t, w.cons, "bob")
	offloadtest.GrantNodesProxy(t, w.cons, "kubelet-api-reader", "bob", "get")
	w.localPod(t, appsNS, "unbound", "")
	w.localPod(t, "default", "elsewhere", offload.VirtualNodeName(w.provider)) // default is not offloaded

	logs := "/containerLogs/" + appsNS + "/" + kubeletAPIPod + "/server"
	execPath := "/exec/" + appsNS + "/" + kubeletAPIPod + "/server?command=/testserver&output=1"
	for _, tc := range []struct {
		name         string
		cert         *tls.Certificate
		method, path string
		header       http.Header
		status       int
		says         string
	}{
		{"no client certificate", nil, "GET", logs, nil, http.StatusUnauthorized, "Unauthorized"},
		{"a certificate of another CA", &stranger, "GET", logs, nil, http.StatusUnauthorized, "Unauthorized"},
		{"a user without nodes/proxy", &alice, "GET", logs, nil, http.StatusForbidden, "Forbidden (user=alice, verb=get, resource=nodes, subresource=proxy)"},
		{"a user without nodes/proxy, a pod not there", &alice, "GET", "/containerLogs/apps/nothere/c", nil, http.StatusForbidden, "user=alice"},
		{"a user with get but not create", &bob, "POST", execPath, nil, http.StatusForbidden, "Forbidden (user=bob, verb=create, resource=nodes, subresource=proxy)"},
		{"a user with get", &bob, "GET", logs, nil, http.StatusOK, ": TCP on"},
		{"the caller's credentials stay here", &admin, "GET", logs,
			http.Header{"Authorization": {"Bearer caller-token-not-for-the-provider"}, "Impersonate-User": {"system:admin"}}, http.StatusOK, ": TCP on"},
		{"a pod not there", &admin, "GET", "/containerLogs/apps/nothere/server", nil, http.StatusNotFound, "pod apps/nothere not found"},
		{"a pod on no virtual node", &admin, "GET", "/containerLogs/apps/unbound/server", nil, http.StatusNotFound, "not on a virtual node"},
		{"a namespace not offloaded", &admin, "GET", "/containerLogs/default/elsewhere/server", nil, http.StatusNotFound, "namespace default is not offloaded"},
		{"a remote pod that stands for another", &admin, "GET", "/containerLogs/apps/stale/server", nil, http.StatusNotFound, "not for this pod"},
		{"another route", &admin, "GET", "/pods", nil, http.StatusNotFound, "404 page not found"},
		{"exec without a container", &admin, "POST", "/exec/apps/web", nil, http.StatusNotFound, "404 page not found"},
		{"logs by the kubelet's uid form", &admin, "GET", "/containerLogs/apps/web/uid/server", nil, http.StatusNotFound, "404 page not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := kubeletRequest(t, w.api, tc.cert, tc.method, tc.path, tc.header)
			if status != tc.status || !strings.Contains(body, tc.says) {
				t.Errorf("%s %s: %d %q, want %d and %q", tc.method, tc.path, status, body, tc.status, tc.says)
			}
		})
	}
}

// 7. The client CA is watched: a CA added to the cluster's bundle is
// trusted at once, and no longer once removed.
func (w *kubeletWorld) testClientCAWatched(t *testing.T) {
	other, err := certs.NewCA("test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	carol := clientCertOf(t, other, "carol", "system:masters")
	path := "/containerLogs/apps/nothere/server"
	if status, body := kubeletRequest(t, w.api, &carol, "GET", path, nil); status != http.StatusUnauthorized {
		t.Fatalf("before her CA is trusted: %d %q, want 401", status, body)
	}
	var before string
	w.editClientCA(t, func(bundle string) string { before = bundle; return bundle + string(other.PEM()) })
	eventually.Within(t, 30*time.Second, "carol's CA trusted", func() error {
		if status, body := kubeletRequest(t, w.api, &carol, "GET", path, nil); status != http.StatusNotFound {
			return fmt.Errorf("%d %q, want 404", status, body)
		}
		return nil
	})
	w.editClientCA(t, func(string) string { return before })
	eventually.Within(t, 30*time.Second, "carol's CA no longer trusted", func() error {
		if status, body := kubeletRequest(t, w.api, &carol, "GET", path, nil); status != http.StatusUnauthorized {
			return fmt.Errorf("%d %q, want 401", status, body)
		}
		return nil
	})
}

func (w *kubeletWorld) editClientCA(t *testing.T, edit func(string) string) {
	t.Helper()
	cms := w.cons.Client.CoreV1().ConfigMaps(certs.ClusterClientCANamespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(t.Context(), certs.ClusterClientCAConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data[certs.ClusterClientCAKey] = edit(cm.Data[certs.ClusterClientCAKey])
		_, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// 8. Neither the provider's credential nor the callers' headers show in
// the log, which holds the requests.
func (w *kubeletWorld) testNoCredentialInLogs(t *testing.T) {
	logs := w.logs.String()
	if !strings.Contains(logs, `"msg":"kubelet API request","component":"kubelet-api","route":"exec"`) {
		t.Fatalf("no exec request in the log: nothing was checked\n%s", logs)
	}
	for what, secret := range map[string]string{
		"the provider's credential": w.token, "a token": offloadtest.JWTHeader,
		"the caller's Authorization header": "caller-token-not-for-the-provider",
	} {
		if strings.Contains(logs, secret) {
			t.Errorf("%s in the kubelet API's log", what)
		}
	}
}

// 9. Requests are counted by route and result.
func (w *kubeletWorld) testMetrics(t *testing.T) {
	m := w.api.m.requests
	for _, c := range [][2]string{
		{"containerLogs", kubeletResultOK}, {"exec", kubeletResultOK}, {"portForward", kubeletResultOK}, {"attach", kubeletResultOK},
		{"containerLogs", kubeletResultUnauthenticated}, {"containerLogs", kubeletResultForbidden},
		{"exec", kubeletResultForbidden}, {"containerLogs", kubeletResultNotFound}, {"other", kubeletResultNotFound},
	} {
		// A stream is counted when it ends, a moment after its client.
		eventually.Within(t, 10*time.Second, fmt.Sprintf("requests %s %s counted", c[0], c[1]), func() error {
			if got := testutil.ToFloat64(m.WithLabelValues(c[0], c[1])); got == 0 {
				return fmt.Errorf("flotilla_kubelet_api_requests_total{route=%q,result=%q} = 0", c[0], c[1])
			}
			return nil
		})
	}
}

// 10. Stopping the kubelet API ends the streams it carries, a follow and
// an upgraded port-forward, and Run returns once they have ended.
func (w *kubeletWorld) testStopEndsStreams(t *testing.T) {
	streams := map[string]<-chan string{"logs -f": w.follow(t), "port-forward": w.portForward(t)}
	// A request is counted when it ends: once Run has returned, both are.
	logs, forwards := w.requests("containerLogs"), w.requests("portForward")
	if err := w.stop(); err != nil {
		t.Fatalf("kubeletapi.Server.Run: %v", err)
	}
	if now := w.requests("containerLogs"); now != logs+1 {
		t.Errorf("Run returned with %v of the follow's request ended, want 1", now-logs)
	}
	if now := w.requests("portForward"); now != forwards+1 {
		t.Errorf("Run returned with %v of the port-forward's request ended, want 1", now-forwards)
	}
	for name, lines := range streams {
		eventually.Within(t, 60*time.Second, "kubectl "+name+" ended", func() error {
			select {
			case _, open := <-lines:
				if !open {
					return nil
				}
			default:
			}
			return errors.New("still running")
		})
	}
}

// 11. An agent restarted: its kubelet API serves the CA it kept, which
// the consumer's API server still trusts, so logs and exec work again.
func (w *kubeletWorld) testRestart(t *testing.T) {
	w.api = w.newAPI(t)
	w.start(t)
	w.testLogs(t)
	w.testExec(t)
}

// 12. The provider's credential changes under the kubelet API: each
// request goes with the credential held at that moment, a token replaced
// within a grant as much as a new grant, and none held is refused here.
func (w *kubeletWorld) testCredentialRotated(t *testing.T) {
	w.api = w.newAPI(t) // the one before stopped with its subtest
	w.start(t)
	w.testLogs(t) // the provider's client made, for the grant of serial 1
	results := func(result string) float64 {
		return testutil.ToFloat64(w.api.m.requests.WithLabelValues("containerLogs", result))
	}
	for _, step := range []struct {
		name   string
		change func(t *testing.T)
		result string // "" for served
	}{
		{"a token the provider does not know, in the same grant", func(*testing.T) {
			good := w.token
			w.token = "not-a-token-of-the-provider"
			w.creds.Set(w.provider, w.providerCredential(1))
			w.token = good
		}, kubeletResultUnreachable},
		{"a new grant with a new token", func(t *testing.T) {
			tok, err := w.tenants.Issue(t.Context(), w.consumer)
			if err != nil {
				t.Fatal(err)
			}
			w.token = tok.Value.Reveal()
			w.creds.Set(w.provider, w.providerCredential(2))
		}, ""},
		{"no credential held", func(*testing.T) { w.creds.Drop(w.provider) }, kubeletResultNoCredential},
		{"a grant again", func(*testing.T) { w.creds.Set(w.provider, w.providerCredential(3)) }, ""},
	} {
		step.change(t)
		if step.result == "" {
			w.testLogs(t)
			continue
		}
		before := results(step.result)
		if out, err := w.kubectl("logs", kubeletAPIPod); err == nil {
			t.Errorf("%s: kubectl logs served %q, want it refused", step.name, out)
		}
		eventually.Within(t, 10*time.Second, step.name+": the request counted as "+step.result, func() error {
			if results(step.result) == before {
				return fmt.Errorf("no request counted as %s", step.result)
			}
			return nil
		})
	}
}

// requests is how many requests of route have ended, whatever their
// result.
func (w *kubeletWorld) requests(route string) float64 {
	var n float64
	for _, result := range []string{kubeletResultOK, kubeletResultUnauthenticated, kubeletResultForbidden, kubeletResultNotFound,
		kubeletResultNoCredential, kubeletResultRefused, kubeletResultUnreachable, kubeletResultError} {
		n += testutil.ToFloat64(w.api.m.requests.WithLabelValues(route, result))
	}
	return n
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

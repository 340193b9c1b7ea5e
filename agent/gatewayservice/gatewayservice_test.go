package gatewayservice

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/test/harness"
)

const namespace = "flotilla-system"

var selector = map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent"}

// apiServer is a real control plane with the agent's namespace.
func apiServer(t *testing.T) kubernetes.Interface {
	t.Helper()
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("cp", harness.ControlPlaneOptions{})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cp.Client
}

func service(kube kubernetes.Interface, typ Type) *Service {
	return &Service{
		Client: kube.CoreV1(), Namespace: namespace, Type: typ, Selector: selector,
		Listen: Ports{WireGuard: 51820, Gossip: 7946}, NodeAddr: netip.MustParseAddr("192.0.2.10"),
		Log: slog.Default(),
	}
}

func TestParseType(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Type
		err  bool
	}{
		{"", None, false}, {"None", None, false}, {"NodePort", NodePort, false}, {"LoadBalancer", LoadBalancer, false},
		{"nodeport", "", true}, {"ClusterIP", "", true},
	} {
		got, err := ParseType(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("ParseType(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// The NodePort Service: the node ports advertised with the node's
// address, gossip's TCP and UDP on one node port, the agent listening on
// the node ports, and the same ports at every start.
func TestNodePortAdvertisesTheNodePorts(t *testing.T) {
	kube := apiServer(t)
	ctx := t.Context()
	got, err := service(kube, NodePort).Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := kube.CoreV1().Services(namespace).Get(ctx, Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !Ours(svc) || svc.Spec.Type != corev1.ServiceTypeNodePort || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Fatalf("Service %+v %+v: want ours, NodePort, external traffic Local", svc.Labels, svc.Spec)
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort < 30000 || p.TargetPort.IntVal != p.NodePort {
			t.Errorf("port %s: node port %d, target %s; want a node port and the target on it", p.Name, p.NodePort, p.TargetPort.String())
		}
	}
	want := Exposed{
		Addr:       netip.MustParseAddr("192.0.2.10"),
		Advertised: Ports{WireGuard: nodePort(svc, PortWireGuard), Gossip: nodePort(svc, PortGossipTCP)},
	}
	want.Listen = want.Advertised
	if got != want || nodePort(svc, PortGossipUDP) != want.Advertised.Gossip {
		t.Fatalf("exposed %+v, want %+v (Service ports %s)", got, want, describePorts(svc))
	}
	again, err := service(kube, NodePort).Ensure(ctx)
	if err != nil || again != got {
		t.Fatalf("second start: %+v, %v; want the same %+v", again, err, got)
	}
}

// The LoadBalancer Service: the agent waits for the load balancer's
// address (here written by the test, as a cloud's controller would) and
// advertises it with the Service's ports.
func TestLoadBalancerAdvertisesItsAddress(t *testing.T) {
	kube := apiServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type result struct {
		e   Exposed
		err error
	}
	done := make(chan result, 1)
	go func() {
		e, err := service(kube, LoadBalancer).Ensure(ctx)
		done <- result{e, err}
	}()
	var svc *corev1.Service
	for svc == nil {
		s, err := kube.CoreV1().Services(namespace).Get(ctx, Name, metav1.GetOptions{})
		if err == nil {
			svc = s
		} else if ctx.Err() != nil {
			t.Fatal("no gateway Service")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("Ensure returned before the load balancer had an address: %+v, %v", r.e, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}
	if _, err := kube.CoreV1().Services(namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	want := Exposed{Addr: netip.MustParseAddr("203.0.113.7"), Advertised: Ports{51820, 7946}, Listen: Ports{51820, 7946}}
	if r.err != nil || r.e != want {
		t.Fatalf("exposed %+v, %v; want %+v", r.e, r.err, want)
	}
}

// A Service of the name that is not the agent's is never adopted nor
// removed.
func TestForeignServiceIsLeftAlone(t *testing.T) {
	kube := apiServer(t)
	ctx := t.Context()
	foreign := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: Name, Namespace: namespace, Labels: map[string]string{"app": "someone-else"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := kube.CoreV1().Services(namespace).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := service(kube, NodePort).Ensure(ctx)
	if err == nil || !strings.Contains(err.Error(), "is not the agent's") {
		t.Fatalf("Ensure over a foreign Service: %v, want a refusal", err)
	}
	if removed, err := Remove(ctx, kube.CoreV1(), namespace); removed || err != nil {
		t.Fatalf("Remove of a foreign Service: removed %v, %v", removed, err)
	}
	svc, err := kube.CoreV1().Services(namespace).Get(ctx, Name, metav1.GetOptions{})
	if err != nil || svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Labels["app"] != "someone-else" {
		t.Fatalf("the foreign Service after Ensure and Remove: %+v, %v", svc, err)
	}
}

// Back to None: the agent's Service goes.
func TestRemoveTakesOurs(t *testing.T) {
	kube := apiServer(t)
	ctx := t.Context()
	if _, err := service(kube, NodePort).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if removed, err := Remove(ctx, kube.CoreV1(), namespace); !removed || err != nil {
		t.Fatalf("Remove: removed %v, %v", removed, err)
	}
	if _, err := kube.CoreV1().Services(namespace).Get(ctx, Name, metav1.GetOptions{}); err == nil {
		t.Fatal("the gateway Service is still there")
	}
}

// A load balancer known by a host name (as some clouds give them) is
// advertised at its first IPv4 address; one that does not resolve is an
// error that says what to fix.
func TestLoadBalancerHostName(t *testing.T) {
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		if host == "lb.example" {
			return []netip.Addr{netip.MustParseAddr("198.51.100.4")}, nil
		}
		return nil, errors.New("no such host")
	}
	for _, tc := range []struct {
		name    string
		ingress []corev1.LoadBalancerIngress
		want    netip.Addr
		err     string
	}{
		{"none yet", nil, netip.Addr{}, ""},
		{"an IP", []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}, netip.MustParseAddr("203.0.113.7"), ""},
		{"a host name", []corev1.LoadBalancerIngress{{Hostname: "lb.example"}}, netip.MustParseAddr("198.51.100.4"), ""},
		{"a host name that does not resolve", []corev1.LoadBalancerIngress{{Hostname: "gone.example"}}, netip.Addr{}, "fix its DNS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{Resolve: resolve}
			svc := &corev1.Service{Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: tc.ingress}}}
			got, err := s.ingress(t.Context(), svc)
			if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("ingress %+v: %v, %v; want %v, an error saying %q", tc.ingress, got, err, tc.want, tc.err)
			}
		})
	}
}

package deploy

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/eventually"
	grantterms "github.com/flotilla-io/flotilla/offload/grant"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/test/harness"
)

// fencedID is the consumer of TestTenantFence.
const fencedID = "cf3nce7bd2kfx6lmjwuq4ntr5ya"

// TestTenantFence applies deploy/ to a real control plane, has the agent
// make a consumer's tenant with its own token (tenancy, as a provider
// does), and tries with the token the agent issued to the consumer what
// a hostile consumer would: a hostPath pod, a privileged one, one without
// seccomp, one on a control-plane node of its choice, an EndpointSlice
// that sends a Service's traffic to the API server, and more Services
// than its quota. Each is refused after a witness request of the same
// kind went through, and its status code is logged.
func TestTenantFence(t *testing.T) {
	cp := installDeploy(t)
	ctx := t.Context()

	controlPlane := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "control-plane", Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""}}}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, controlPlane, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tenants, err := tenancy.NewTenants(tenancy.TenantsConfig{Config: agentConfig(t, cp)})
	if err != nil {
		t.Fatal(err)
	}
	const services = 3
	limits := grantterms.Limits{Fence: grantterms.Fence{Services: services, EndpointNetworks: "10.80.0.0/16"}}
	tenant, err := tenants.Ensure(ctx, fencedID, limits)
	if err != nil {
		t.Fatalf("the agent makes the tenant with its own token: %v", err)
	}
	t.Cleanup(func() {
		if err := tenants.Remove(context.Background(), fencedID); err != nil {
			t.Errorf("remove the tenant: %v", err)
		}
	})
	tok, err := tenants.Issue(ctx, fencedID)
	if err != nil {
		t.Fatalf("the agent issues the consumer a token: %v", err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tok.Value.Reveal()
	consumer := kubernetes.NewForConfigOrDie(cfg)
	ns := tenant.Namespace
	pods, slices, svcs := consumer.CoreV1().Pods(ns), consumer.DiscoveryV1().EndpointSlices(ns), consumer.CoreV1().Services(ns)

	// The witness: a pod as docs/offload.md says a consumer writes it.
	// The quota admits pods once its controller has computed usage.
	eventually.Within(t, 60*time.Second, "the consumer creates a restricted pod", func() error {
		_, err := pods.Create(ctx, fencedPod("witness", func(*corev1.PodSpec) {}), metav1.CreateOptions{})
		return err
	})
	yes := true
	unconfined := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
	for _, tc := range []struct {
		what, why string
		change    func(*corev1.PodSpec)
	}{
		{"host-path", `restricted volume type "hostPath"`, func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
			s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "root", MountPath: "/host"}}
		}},
		{"privileged", "must not set securityContext.privileged=true", func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext.Privileged, s.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes, nil
		}},
		{"unconfined-seccomp", `seccompProfile.type to "Unconfined"`, func(s *corev1.PodSpec) {
			s.SecurityContext.SeccompProfile = unconfined
		}},
		{"nodename-control-plane", "may not place its pod on a node of its choice (spec.nodeName control-plane)", func(s *corev1.PodSpec) {
			s.NodeName = controlPlane.Name
		}},
	} {
		t.Run("pod "+tc.what, func(t *testing.T) {
			refused(t, "create a "+tc.what+" pod", tc.why, func(ctx context.Context) error {
				_, err := pods.Create(ctx, fencedPod(tc.what, tc.change), metav1.CreateOptions{})
				return err
			})
		})
	}

	t.Run("EndpointSlice to the API server", func(t *testing.T) {
		// The harness's API server listens on loopback, which no
		// EndpointSlice may hold: its Service's address stands for it.
		svc, err := cp.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		apiServer := netip.MustParseAddr(svc.Spec.ClusterIP)
		if _, err := slices.Create(ctx, routedSlice("app-home", "10.80.3.4"), metav1.CreateOptions{}); err != nil {
			t.Fatalf("the consumer points a Service at its own pod at home (10.80.3.4, in the view): %v", err)
		}
		refused(t, "point a Service at the API server "+apiServer.String(), "may point only at its own endpoints", func(ctx context.Context) error {
			_, err := slices.Create(ctx, routedSlice("app-api", apiServer.String()), metav1.CreateOptions{})
			return err
		})
	})

	t.Run("Services beyond the quota", func(t *testing.T) {
		for i := range services {
			name := fmt.Sprintf("svc-%d", i)
			eventually.Within(t, 30*time.Second, "the consumer creates Service "+name, func() error {
				_, err := svcs.Create(ctx, service(name, corev1.ServiceTypeClusterIP), metav1.CreateOptions{})
				return err
			})
		}
		refused(t, fmt.Sprintf("create Service %d of %d allowed", services+1, services), "exceeded quota", func(ctx context.Context) error {
			_, err := svcs.Create(ctx, service("one-too-many", corev1.ServiceTypeClusterIP), metav1.CreateOptions{})
			return err
		})
	})
}

// refused checks that do is Forbidden with a message that says why, and
// logs its status code.
func refused(t *testing.T, what, why string, do func(context.Context) error) {
	t.Helper()
	err := do(t.Context())
	status, ok := err.(apierrors.APIStatus)
	if !apierrors.IsForbidden(err) || !ok {
		t.Fatalf("the consumer may %s: got %v, want Forbidden", what, err)
	}
	t.Logf("%s: %d %s", what, status.Status().Code, err)
	if !strings.Contains(err.Error(), why) {
		t.Errorf("the consumer may not %s, but the message does not say %q: %v", what, why, err)
	}
}

// fencedPod is a pod that meets Pod Security restricted and the
// policies, then changed by change.
func fencedPod(name string, change func(*corev1.PodSpec)) *corev1.Pod {
	spec := harness.Restricted(&corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}})
	change(spec)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: *spec}
}

// routedSlice is an EndpointSlice of Service app that kube-proxy would
// route by, with one endpoint at address.
func routedSlice(name, address string) *discoveryv1.EndpointSlice {
	port, proto := int32(80), corev1.ProtocolTCP
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "app"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{address}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	}
}

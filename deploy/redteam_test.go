package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	admissionregistrationv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/agent/gatewayservice"
	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/offload/placement"
	"github.com/flotilla-io/flotilla/test/harness"
)

// providerID is the cluster ID of a provider this cluster offloads to:
// its virtual node is VirtualNodeName(providerID).
const providerID = "cp7m2xq4vhd3kz6wbn5ytr2jsfa"

// The red team: someone holding the agent's ServiceAccount token tries to
// become cluster admin through what the agent is allowed to write. Each
// attempt is made with that token and must be refused; the test prints
// each refusal with its HTTP status, and checks afterwards that nothing
// it aimed at changed. Before the refusals the agent does, with the same
// token, the legitimate write beside each one, which must pass.
func (g *grant) testAgentRedTeam(t *testing.T) {
	rt := newRedTeam(t, g)
	waitAgentFencesEnforced(t, g.cp, g.agent)
	rt.legitimateWrites(t)

	agent := g.agent
	slices := agent.DiscoveryV1().EndpointSlices("kube-system")
	webhooks := agent.AdmissionregistrationV1().MutatingWebhookConfigurations()
	jsonPatch := func(body string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := webhooks.Patch(ctx, placement.ConfigurationName, types.JSONPatchType, []byte(body), metav1.PatchOptions{})
			return err
		}
	}
	address := func(pod string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := agent.CoreV1().Pods(rt.podNamespace(pod)).Patch(ctx, pod, types.MergePatchType,
				[]byte(`{"status":{"podIP":"10.66.6.6","podIPs":[{"ip":"10.66.6.6"}]}}`), metav1.PatchOptions{}, "status")
			return err
		}
	}
	deletePod := func(pod string) func(context.Context) error {
		return func(ctx context.Context) error {
			return agent.CoreV1().Pods(rt.podNamespace(pod)).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	}
	notVirtual := "only pods bound to its virtual nodes"
	webhookRule := "may match pods on CREATE only"
	webhookNamespaces := "may match only namespaces labelled flotilla.io/offloaded=true"
	kubeDNS := "serves kube-dns"
	// A Secret that is there to read: RBAC refuses before the lookup, so
	// the refusal says nothing of whether it exists.
	target := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "red-team-target"}, StringData: map[string]string{"key": "value"}}
	if _, err := g.cp.Client.CoreV1().Secrets("kube-system").Create(t.Context(), target, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = g.cp.Client.CoreV1().Secrets("kube-system").Delete(context.Background(), target.Name, metav1.DeleteOptions{})
	})
	for _, r := range []refusal{
		// Secrets: read only in offloaded namespaces, through a binding
		// there (reflection), never here nor cluster-wide.
		{"read a kube-system Secret", "cannot get resource \"secrets\"", func(ctx context.Context) error {
			_, err := agent.CoreV1().Secrets("kube-system").Get(ctx, target.Name, metav1.GetOptions{})
			return err
		}},
		{"list Secrets in every namespace", "cannot list resource \"secrets\"", func(ctx context.Context) error {
			_, err := agent.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
			return err
		}},
		// The webhook: on every pod of every namespace, kube-system's too.
		{"patch the webhook to match pods in every namespace", webhookNamespaces,
			jsonPatch(`[{"op":"replace","path":"/webhooks/0/namespaceSelector","value":{}}]`)},
		{"patch the webhook to match kube-system", webhookNamespaces,
			jsonPatch(`[{"op":"replace","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values","value":["flotilla-system"]}]`)},
		{"patch the webhook to match pod updates", webhookRule,
			jsonPatch(`[{"op":"replace","path":"/webhooks/0/rules/0/operations","value":["*"]}]`)},
		{"patch the webhook to match every resource", webhookRule,
			jsonPatch(`[{"op":"replace","path":"/webhooks/0/rules/0/resources","value":["*"]}]`)},
		{"add a second webhook for every pod", "may configure one webhook", func(ctx context.Context) error {
			cfg, err := webhooks.Get(ctx, placement.ConfigurationName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("read the agent's own configuration: %w", err)
			}
			second := cfg.Webhooks[0]
			second.Name = "everything.flotilla.io"
			second.NamespaceSelector = &metav1.LabelSelector{}
			patch, err := json.Marshal([]map[string]any{{"op": "add", "path": "/webhooks/-", "value": second}})
			if err != nil {
				return err
			}
			return jsonPatch(string(patch))(ctx)
		}},
		{"create another webhook configuration", "", func(ctx context.Context) error {
			cfg := rt.webhookConfiguration()
			cfg.WithName("everything")
			_, err := webhooks.Apply(ctx, cfg, metav1.ApplyOptions{FieldManager: "red-team", Force: true})
			return err
		}},

		// The fabric DaemonSet: privileged pods on every node.
		{"create a privileged DaemonSet in kube-system", "", func(ctx context.Context) error {
			ds := rt.fabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
				p.Containers[0].SecurityContext.WithPrivileged(true).WithAllowPrivilegeEscalation(true)
			})
			ds.WithNamespace("kube-system").WithName("node-shell")
			_, err := agent.AppsV1().DaemonSets("kube-system").Apply(ctx, ds, metav1.ApplyOptions{FieldManager: "red-team", Force: true})
			return err
		}},
		{"make the fabric DaemonSet privileged", "is not privileged", rt.applyFabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
			p.Containers[0].SecurityContext.WithPrivileged(true).WithAllowPrivilegeEscalation(true)
		})},
		{"add SYS_ADMIN to the fabric DaemonSet", "adds NET_ADMIN only", rt.applyFabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
			p.Containers[0].SecurityContext.Capabilities.WithAdd("SYS_ADMIN")
		})},
		{"mount the node's root in the fabric DaemonSet", "no volumes (no hostPath)", rt.applyFabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
			p.WithVolumes(corev1ac.Volume().WithName("host").WithHostPath(corev1ac.HostPathVolumeSource().WithPath("/")))
			p.Containers[0].WithVolumeMounts(corev1ac.VolumeMount().WithName("host").WithMountPath("/host"))
		})},
		{"run another image in the fabric DaemonSet", "runs the image of the Deployment flotilla-agent", rt.applyFabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
			p.Containers[0].WithImage("example.invalid/node-shell:latest")
		})},
		{"run a shell command in the fabric DaemonSet", "no command", rt.applyFabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
			p.Containers[0].WithCommand("/bin/sh", "-c", "nsenter -t 1 -m -- sh")
		})},
		{"run the fabric DaemonSet as the agent's account", "runs as the ServiceAccount flotilla-fabric", rt.applyFabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
			p.WithServiceAccountName(serviceAccount)
		})},
		{"share the node's processes from the fabric DaemonSet", "no hostPID", rt.applyFabric(t, func(p *corev1ac.PodSpecApplyConfiguration) {
			p.WithHostPID(true)
		})},

		// Pods that are not the agent's: on real nodes, unbound, on a
		// node only named like a virtual node.
		{"delete a kube-system pod on a real node", notVirtual, deletePod(rt.realPod)},
		{"re-address a kube-system pod on a real node", notVirtual, address(rt.realPod)},
		{"delete a pod bound to no node", notVirtual, deletePod(rt.pendingPod)},
		{"re-address a pod bound to no node", notVirtual, address(rt.pendingPod)},
		{"delete a pod on a node named like a virtual node", notVirtual, deletePod(rt.lookalikePod)},

		// kube-dns: the cluster's DNS answered from somewhere else.
		{"add an endpoint to kube-dns's EndpointSlice", "is not one", func(ctx context.Context) error {
			patch := `{"endpoints":[{"addresses":["10.66.6.6"]}]}`
			_, err := slices.Patch(ctx, rt.dnsSlice, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}},
		{"add an endpoint to kube-dns in a slice labelled as an import", kubeDNS, func(ctx context.Context) error {
			_, err := slices.Create(ctx, endpointSlice("kube-dns-import", "kube-dns", mcs.ManagedBy), metav1.CreateOptions{})
			return err
		}},
		{"add an endpoint to kube-dns in a slice labelled as a translation", kubeDNS, func(ctx context.Context) error {
			_, err := slices.Create(ctx, endpointSlice("kube-dns-translated", "kube-dns", offload.HostedEndpointsManagedBy), metav1.CreateOptions{})
			return err
		}},
		{"capture traffic to an outside address with a derived Service", "without a selector or external IPs", func(ctx context.Context) error {
			svc := derivedService("kube-system")
			svc.Spec.ExternalIPs = []string{"203.0.113.53"}
			_, err := agent.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{})
			return err
		}},
		{"make a Service of its own beside kube-dns", "named flotilla-mcs-*", func(ctx context.Context) error {
			svc := derivedService("kube-system")
			svc.Name = "kube-dns-2"
			_, err := agent.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{})
			return err
		}},

		// The gateway Service (--gateway-service): a port on every node,
		// to the agent's pods only.
		{"expose kube-dns on every node through a gateway Service", "selects the agent's pods only", func(ctx context.Context) error {
			svc := gatewayService(namespace)
			svc.Spec.Selector = map[string]string{"k8s-app": "kube-dns"}
			_, err := agent.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
			return err
		}},
		{"make a gateway Service in kube-system", "ValidatingAdmissionPolicy 'flotilla-agent-", func(ctx context.Context) error {
			_, err := agent.CoreV1().Services("kube-system").Create(ctx, gatewayService("kube-system"), metav1.CreateOptions{})
			return err
		}},
		{"expose the agent's metrics port on every node", "has the ports wireguard (UDP), gossip (TCP) and gossip-udp (UDP) only", func(ctx context.Context) error {
			svc := gatewayService(namespace)
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "metrics", Port: 9470, Protocol: corev1.ProtocolTCP})
			_, err := agent.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
			return err
		}},
		{"capture traffic to an outside address with the gateway Service", "claims no external IPs", func(ctx context.Context) error {
			svc := gatewayService(namespace)
			svc.Spec.ExternalIPs = []string{"203.0.113.53"}
			_, err := agent.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
			return err
		}},
		{"make a NodePort Service not labelled as its gateway", "is not one", func(ctx context.Context) error {
			svc := gatewayService(namespace)
			svc.Name, svc.Labels = "node-shell", nil
			_, err := agent.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
			return err
		}},

		// The label that sends a namespace's pods to its webhook: an
		// administrator's. In a user's namespace two policies refuse it,
		// either may answer; in its tenants' only the label's.
		{"label a namespace into its webhook", "ValidatingAdmissionPolicy 'flotilla-agent-", offloadedLabel(agent, rt.unlabelled, `"true"`)},
		{"take the administrator's label off a namespace", "ValidatingAdmissionPolicy 'flotilla-agent-", offloadedLabel(agent, rt.labelled, "null")},
		{"label its tenant namespace into its webhook", notOffloadedLabel, offloadedLabel(agent, tenant, `"true"`)},
		{"create a tenant namespace labelled into its webhook", notOffloadedLabel, func(ctx context.Context) error {
			_, err := agent.CoreV1().Namespaces().Create(ctx, offloadedTenant("cred7team"), metav1.CreateOptions{})
			return err
		}},

		// RBAC and namespaces.
		{"bind the consumer role in kube-system", "ValidatingAdmissionPolicy 'flotilla-agent-", func(ctx context.Context) error {
			_, err := agent.RbacV1().RoleBindings("kube-system").Create(ctx,
				roleBinding("red-team", "ClusterRole", offload.ConsumerClusterRole, consumerSubject()), metav1.CreateOptions{})
			return err
		}},
		{"bind cluster-admin in kube-system", "not currently held", func(ctx context.Context) error {
			_, err := agent.RbacV1().RoleBindings("kube-system").Create(ctx,
				roleBinding("red-team", "ClusterRole", "cluster-admin", consumerSubject()), metav1.CreateOptions{})
			return err
		}},
		{"delete default", "may not be deleted", func(ctx context.Context) error {
			return agent.CoreV1().Namespaces().Delete(ctx, "default", metav1.DeleteOptions{})
		}},
		{"delete kube-system", "may not be deleted", func(ctx context.Context) error {
			return agent.CoreV1().Namespaces().Delete(ctx, "kube-system", metav1.DeleteOptions{})
		}},
	} {
		t.Run(r.what, func(t *testing.T) { r.checkLogged(t, "the agent") })
	}
	rt.checkUntouched(t)
}

// checkLogged is check, and prints the refusal's status: the red team's
// output lists every attempt with the code the API server answered.
func (r refusal) checkLogged(t *testing.T, as string) {
	t.Helper()
	err := r.do(t.Context())
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		t.Fatalf("%s may %s: got %v, want Forbidden", as, r.what, err)
	}
	s := status.Status()
	t.Logf("%s: %d %s: %s", r.what, s.Code, s.Reason, s.Message)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("%s may %s: got %d %s, want 403 Forbidden", as, r.what, s.Code, s.Reason)
	}
	if !strings.Contains(err.Error(), r.why) {
		t.Errorf("%s may not %s, but the message does not say %q: %v", as, r.what, r.why, err)
	}
}

// redTeam holds what the red team aims at, made by an admin, and what the
// agent legitimately made beside it.
type redTeam struct {
	g     *grant
	owner string // the agent's Deployment, whose image the fabric runs

	realPod, pendingPod, lookalikePod, virtualPod string
	podNamespaces                                 map[string]string
	dnsSlice                                      string
	// labelled and unlabelled are users' namespaces: the administrator
	// labels the first flotilla.io/offloaded=true, the second stays bare.
	labelled, unlabelled string
	before               map[string]string // a fingerprint of each target
}

func newRedTeam(t *testing.T, g *grant) *redTeam {
	t.Helper()
	ctx := t.Context()
	admin := g.cp.Client
	rt := &redTeam{g: g, owner: "flotilla-agent", podNamespaces: map[string]string{}, labelled: "storefront", unlabelled: "payroll"}
	for _, ns := range []string{rt.labelled, rt.unlabelled} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}

	// A provider's virtual node, as the agent makes it, and a real node.
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: offload.VirtualNodeName(providerID), Labels: virtualNodeLabels()}},
		{ObjectMeta: metav1.ObjectMeta{Name: "control-plane-1"}},
	} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	}
	for _, p := range []struct{ name, namespace, node string }{
		{"coredns-1", "kube-system", "control-plane-1"},
		{"coredns-2", "kube-system", ""},
		{"kube-proxy-1", "kube-system", offload.VirtualNodeName("cother")},
		{"web-offloaded", "default", offload.VirtualNodeName(providerID)},
	} {
		pod := pod(p.name)
		pod.Spec.NodeName = p.node
		if _, err := admin.CoreV1().Pods(p.namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rt.podNamespaces[p.name] = p.namespace
		t.Cleanup(func() {
			admin.CoreV1().Pods(p.namespace).Delete(context.Background(), p.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
	}
	rt.realPod, rt.pendingPod, rt.lookalikePod, rt.virtualPod = "coredns-1", "coredns-2", "kube-proxy-1", "web-offloaded"

	// kube-dns, and its EndpointSlice as the EndpointSlice controller
	// makes it.
	dns := service("kube-dns", corev1.ServiceTypeClusterIP)
	if _, err := admin.CoreV1().Services("kube-system").Create(ctx, dns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.CoreV1().Services("kube-system").Delete(context.Background(), dns.Name, metav1.DeleteOptions{})
	})
	eventually.Within(t, 30*time.Second, "the EndpointSlice controller's slice of kube-dns", func() error {
		list, err := admin.DiscoveryV1().EndpointSlices("kube-system").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kube-dns"})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return errors.New("none yet")
		}
		rt.dnsSlice = list.Items[0].Name
		return nil
	})
	return rt
}

func (rt *redTeam) podNamespace(name string) string { return rt.podNamespaces[name] }

// webhookConfiguration is the placement webhook's configuration as the
// agent applies it, at an address where nothing answers: no namespace of
// this cluster is offloaded, so the API server never calls it.
func (rt *redTeam) webhookConfiguration() *admissionregistrationv1ac.MutatingWebhookConfigurationApplyConfiguration {
	return placement.Configuration("https://127.0.0.1:1/placement", rt.g.cp.Config.CAData, namespace, "")
}

// fabric is the fabric's DaemonSet as the agent applies it, changed by
// change.
func (rt *redTeam) fabric(t *testing.T, change func(*corev1ac.PodSpecApplyConfiguration)) *appsv1ac.DaemonSetApplyConfiguration {
	t.Helper()
	owner, err := rt.g.cp.Client.AppsV1().Deployments(namespace).Get(t.Context(), rt.owner, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := fabricapi.DaemonSet(owner)
	if err != nil {
		t.Fatal(err)
	}
	if change != nil {
		change(ds.Spec.Template.Spec)
	}
	return ds
}

// applyFabric applies the fabric's DaemonSet, changed, with the agent's
// token and field manager.
func (rt *redTeam) applyFabric(t *testing.T, change func(*corev1ac.PodSpecApplyConfiguration)) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := rt.g.agent.AppsV1().DaemonSets(namespace).Apply(ctx, rt.fabric(t, change),
			metav1.ApplyOptions{FieldManager: fabricapi.FieldManager, Force: true})
		return err
	}
}

// legitimateWrites are the agent's own writes beside each refusal, with
// its own token: the fences let them through.
func (rt *redTeam) legitimateWrites(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	agent, admin := rt.g.agent, rt.g.cp.Client
	if err := placement.ApplyConfiguration(ctx, agent, rt.webhookConfiguration()); err != nil {
		t.Fatalf("the agent applies its placement webhook: %v", err)
	}
	t.Cleanup(func() { placement.DeleteConfiguration(context.Background(), admin) })
	pub := fabricapi.NewPublisher(agent, namespace, rt.owner, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err := pub.ApplyDaemonSet(ctx); err != nil {
		t.Fatalf("the agent applies the fabric's DaemonSet: %v", err)
	}
	t.Cleanup(func() {
		admin.AppsV1().DaemonSets(namespace).Delete(context.Background(), fabricapi.DaemonSetName, metav1.DeleteOptions{})
	})

	pods := agent.CoreV1().Pods(rt.podNamespace(rt.virtualPod))
	if _, err := pods.Patch(ctx, rt.virtualPod, types.MergePatchType,
		[]byte(`{"status":{"podIP":"10.70.0.5","podIPs":[{"ip":"10.70.0.5"}]}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("the agent writes the status of a pod on its virtual node: %v", err)
	}

	// An import of a Service exported from kube-system elsewhere: its
	// derived Service and slice.
	services, slices := agent.CoreV1().Services("kube-system"), agent.DiscoveryV1().EndpointSlices("kube-system")
	derived, err := services.Create(ctx, derivedService("kube-system"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the agent derives a Service for an import: %v", err)
	}
	slice := endpointSlice(derived.Name+"-0", derived.Name, mcs.ManagedBy)
	if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Errorf("the agent writes an import's slice: %v", err)
	}
	if err := slices.Delete(ctx, slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the agent deletes an import's slice: %v", err)
	}
	if err := services.Delete(ctx, derived.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the agent deletes its derived Service: %v", err)
	}

	// The gateway Service (--gateway-service), applied and removed as
	// the agent does.
	gw := &gatewayservice.Service{
		Client: agent.CoreV1(), Namespace: namespace, Type: gatewayservice.NodePort,
		Selector: map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent", "flotilla.io/gateway-role": "active"},
		Listen:   gatewayservice.Ports{WireGuard: 51820, Gossip: 7946}, NodeAddr: netip.MustParseAddr("192.0.2.1"),
		Log: slog.New(slog.DiscardHandler),
	}
	if _, err := gw.Ensure(ctx); err != nil {
		t.Errorf("the agent applies its gateway Service: %v", err)
	}
	if removed, err := gatewayservice.Remove(ctx, agent.CoreV1(), namespace); !removed || err != nil {
		t.Errorf("the agent removes its gateway Service: removed %v, %v", removed, err)
	}

	// Offloading a namespace: the administrator sets the label, and the
	// agent changes its tenant's other labels with the label left alone.
	if err := offloadedLabel(admin, rt.labelled, `"true"`)(ctx); err != nil {
		t.Errorf("the administrator labels namespace %s %s=true: %v", rt.labelled, offload.LabelOffloaded, err)
	}
	for _, value := range []string{`"yes"`, "null"} {
		patch := fmt.Sprintf(`{"metadata":{"labels":{"flotilla.io/red-team-witness":%s}}}`, value)
		if _, err := agent.CoreV1().Namespaces().Patch(ctx, tenant, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Errorf("the agent labels its tenant namespace: %v", err)
		}
	}

	rt.before = rt.fingerprints(t)
	if err := pods.Delete(ctx, rt.virtualPod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Errorf("the agent deletes a pod on its virtual node: %v", err)
	}
}

// fingerprints are what the red team aims at, as an admin reads them.
func (rt *redTeam) fingerprints(t *testing.T) map[string]string {
	t.Helper()
	ctx := t.Context()
	admin := rt.g.cp.Client
	fp := map[string]string{}
	cfg, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, placement.ConfigurationName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fp["webhook"] = cfg.ResourceVersion
	ds, err := admin.AppsV1().DaemonSets(namespace).Get(ctx, fabricapi.DaemonSetName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fp["fabric"] = fmt.Sprint(ds.Generation)
	for _, name := range []string{rt.realPod, rt.pendingPod, rt.lookalikePod} {
		p, err := admin.CoreV1().Pods(rt.podNamespace(name)).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fp["pod "+name] = fmt.Sprintf("%s %v %q", p.UID, p.DeletionTimestamp, p.Status.PodIP)
	}
	slices, err := admin.DiscoveryV1().EndpointSlices("kube-system").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		fp["slices of kube-dns"] += fmt.Sprintf("%s %v; ", s.Name, s.Endpoints)
	}
	services, err := admin.CoreV1().Services("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range services.Items {
		fp["services of kube-system"] += s.Name + " "
	}
	ours, err := admin.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ours.Items {
		fp["services of "+namespace] += s.Name + " "
	}
	bindings, err := admin.RbacV1().RoleBindings("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fp["rolebindings of kube-system"] = fmt.Sprint(len(bindings.Items))
	for _, ns := range []string{"default", "kube-system", rt.labelled, rt.unlabelled, tenant} {
		n, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		label, ok := n.Labels[offload.LabelOffloaded]
		fp["namespace "+ns] = fmt.Sprintf("%s, %s=%q (%v)", n.Status.Phase, offload.LabelOffloaded, label, ok)
	}
	return fp
}

// notOffloadedLabel is flotilla-agent-offloaded-label's refusal.
const notOffloadedLabel = "may not set, change or remove flotilla.io/offloaded"

// offloadedLabel sets flotilla.io/offloaded on namespace ns to value (a
// JSON string, or null to remove it) with c's credential.
func offloadedLabel(c kubernetes.Interface, ns, value string) func(context.Context) error {
	return func(ctx context.Context) error {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, offload.LabelOffloaded, value)
		_, err := c.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
}

// offloadedTenant is consumer's tenant namespace as the agent makes it,
// labelled flotilla.io/offloaded=true besides.
func offloadedTenant(consumer string) *corev1.Namespace {
	l := tenantNamespaceLabels(consumer)
	l[offload.LabelOffloaded] = "true"
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: offload.TenantNamespace(consumer), Labels: l}}
}

// checkUntouched fails for each target the refused attempts changed.
func (rt *redTeam) checkUntouched(t *testing.T) {
	t.Helper()
	after := rt.fingerprints(t)
	for k, was := range rt.before {
		if after[k] != was {
			t.Errorf("%s after the refused attempts: %s, was %s", k, after[k], was)
		}
	}
}

// waitAgentFencesEnforced waits until each policy of
// admission-agent.yaml refuses, to the agent's own token, a dry run it
// exists for: the API server loads policies in the background, and a
// refusal, or a write let through, tested before would prove nothing.
// deploy/ must be applied to cp.
func waitAgentFencesEnforced(t *testing.T, cp *harness.ControlPlane, agent kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	dry := []string{metav1.DryRunAll}
	witness := pod("fence-witness")
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, witness, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer cp.Client.CoreV1().Pods("default").Delete(ctx, witness.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	owner, err := cp.Client.AppsV1().Deployments(namespace).Get(ctx, "flotilla-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		policy string
		do     func() error
	}{
		{"flotilla-agent-placement-webhook", func() error {
			cfg := placement.Configuration("https://127.0.0.1:1/placement", cp.Config.CAData, namespace, "")
			cfg.Webhooks[0].NamespaceSelector = nil
			_, err := agent.AdmissionregistrationV1().MutatingWebhookConfigurations().Apply(ctx, cfg,
				metav1.ApplyOptions{FieldManager: "witness", Force: true, DryRun: dry})
			return err
		}},
		{"flotilla-agent-fabric", func() error {
			ds, err := fabricapi.DaemonSet(owner)
			if err != nil {
				return err
			}
			ds.Spec.Template.Spec.WithHostPID(true)
			_, err = agent.AppsV1().DaemonSets(namespace).Apply(ctx, ds, metav1.ApplyOptions{FieldManager: "witness", Force: true, DryRun: dry})
			return err
		}},
		{"flotilla-agent-pods", func() error {
			return agent.CoreV1().Pods("default").Delete(ctx, witness.Name, metav1.DeleteOptions{DryRun: dry})
		}},
		{"flotilla-agent-endpointslices", func() error {
			_, err := agent.DiscoveryV1().EndpointSlices("kube-system").Create(ctx,
				endpointSlice("witness", "kube-dns", mcs.ManagedBy), metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"flotilla-agent-derived-services", func() error {
			svc := derivedService("kube-system")
			svc.Name = "witness"
			_, err := agent.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"flotilla-agent-gateway-service", func() error {
			svc := gatewayService(namespace)
			svc.Spec.ExternalIPs = []string{"203.0.113.53"}
			_, err := agent.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"flotilla-agent-offloaded-label", func() error {
			_, err := agent.CoreV1().Namespaces().Create(ctx, offloadedTenant("cwitness"), metav1.CreateOptions{DryRun: dry})
			return err
		}},
	} {
		eventually.Within(t, 30*time.Second, "policy "+w.policy+" enforced", func() error {
			if err := w.do(); err == nil || !containsPolicy(err, w.policy) {
				return fmt.Errorf("witness request: %v", err)
			}
			return nil
		})
	}
}

// gatewayService is the agent's gateway Service (--gateway-service=NodePort)
// in namespace ns.
func gatewayService(ns string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: gatewayservice.Name, Namespace: ns, Labels: gatewayservice.Labels},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/component": "agent"},
			Ports: []corev1.ServicePort{
				{Name: gatewayservice.PortWireGuard, Port: 51820, Protocol: corev1.ProtocolUDP},
				{Name: gatewayservice.PortGossipTCP, Port: 7946, Protocol: corev1.ProtocolTCP},
				{Name: gatewayservice.PortGossipUDP, Port: 7946, Protocol: corev1.ProtocolUDP},
			},
		},
	}
}

// derivedService is a Service the agent derives for an import.
func derivedService(ns string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: mcs.DerivedServiceName("dns"), Namespace: ns, Labels: map[string]string{mcs.LabelManagedBy: mcs.ManagedBy}},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP}}},
	}
}

// endpointSlice is a slice of one endpoint for service, managed by
// managedBy.
func endpointSlice(name, service, managedBy string) *discoveryv1.EndpointSlice {
	port, proto := int32(53), corev1.ProtocolUDP
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: managedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.96.0.10"}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	}
}

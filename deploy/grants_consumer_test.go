package deploy

import (
	"context"
	"fmt"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/test/harness"
)

// consumerAccess is what the ClusterRole flotilla-consumer, bound in the
// tenant namespace, allows there, and what the consumer may not do.
func consumerAccess() []access {
	var cases []access
	verbs := []string{"create", "get", "list", "watch", "update", "patch", "delete", "deletecollection"}
	for _, r := range []struct{ group, resource string }{
		{"", "pods"}, {"", "configmaps"}, {"", "secrets"}, {"", "services"}, {"discovery.k8s.io", "endpointslices"},
	} {
		for _, v := range verbs {
			cases = append(cases, allow(v, r.group, r.resource, tenant, ""))
		}
	}
	podLog := allow("get", "", "pods", tenant, "p")
	podLog.subresource = "log"
	cases = append(cases, podLog)
	// kubectl exec, attach and port-forward, which the consumer's virtual
	// nodes forward as SPDY upgrades (POST: create); never as WebSocket
	// GETs.
	for _, sub := range []string{"exec", "attach", "portforward"} {
		stream, get := allow("create", "", "pods", tenant, "p"), deny("get", "", "pods", tenant, "p")
		stream.subresource, get.subresource = sub, sub
		cases = append(cases, stream, get)
	}
	for _, v := range []string{"get", "list", "watch"} {
		cases = append(cases, allow(v, "", "serviceaccounts", tenant, ""),
			allow(v, "", "events", tenant, ""), allow(v, "events.k8s.io", "events", tenant, ""))
	}

	// Its requests for mirrored namespaces, in its tenant namespace; never
	// their status, which is the provider's answer.
	for _, v := range []string{"create", "get", "list", "watch", "update", "patch", "delete"} {
		cases = append(cases, allow(v, "flotilla.io", "namespacerequests", tenant, ""))
	}
	sub := func(a access, subresource string) access { a.subresource = subresource; return a }
	cases = append(cases,
		sub(deny("update", "flotilla.io", "namespacerequests", tenant, "shop-q3x7bd"), "status"),
		sub(deny("patch", "flotilla.io", "namespacerequests", tenant, "shop-q3x7bd"), "status"),
		deny("create", "flotilla.io", "namespacerequests", "default", ""),
		deny("list", "flotilla.io", "namespacerequests", "", ""))
	cases = append(cases,
		// Nothing cluster-wide, nothing in other namespaces.
		deny("create", "", "namespaces", "", ""),
		deny("get", "", "namespaces", "", tenant),
		deny("delete", "", "namespaces", "", tenant),
		deny("list", "", "nodes", "", ""),
		deny("get", "", "nodes", "", "worker"),
		deny("get", "", "secrets", "default", ""),
		deny("list", "", "secrets", "kube-system", ""),
		deny("create", "", "secrets", "default", ""),
		deny("list", "", "secrets", "", ""),
		deny("get", "", "pods", "default", ""),
		deny("create", "", "pods", namespace, ""),
		// No RBAC: no bindings, no roles, no escalate or bind.
		deny("create", "rbac.authorization.k8s.io", "rolebindings", tenant, ""),
		deny("create", "rbac.authorization.k8s.io", "roles", tenant, ""),
		deny("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""),
		deny("escalate", "rbac.authorization.k8s.io", "roles", tenant, ""),
		deny("bind", "rbac.authorization.k8s.io", "roles", tenant, ""),
		deny("escalate", "rbac.authorization.k8s.io", "clusterroles", "", ""),
		deny("bind", "rbac.authorization.k8s.io", "clusterroles", tenant, "cluster-admin"),
		deny("bind", "rbac.authorization.k8s.io", "clusterroles", "", offload.ConsumerClusterRole),
		// No impersonation of anyone.
		deny("impersonate", "", "users", "", "admin"),
		deny("impersonate", "", "groups", "", "system:masters"),
		deny("impersonate", "", "serviceaccounts", tenant, "default"),
		deny("impersonate", "authentication.k8s.io", "userextras", "", "scopes"),
		// Into pods only through what the pod spec allows, and streams
		// only in its own namespaces.
		sub(deny("create", "", "pods", "default", "p"), "exec"),
		sub(deny("create", "", "pods", namespace, "p"), "portforward"),
		sub(deny("update", "", "pods", tenant, "p"), "status"),
		sub(deny("patch", "", "pods", tenant, "p"), "ephemeralcontainers"),
		sub(deny("update", "", "services", tenant, "s"), "status"),
		// The grant's own objects are the provider's: no new accounts or
		// tokens, no lifting the quota.
		deny("create", "", "serviceaccounts", tenant, ""),
		sub(deny("create", "", "serviceaccounts", tenant, offload.ConsumerServiceAccount), "token"),
		deny("update", "", "resourcequotas", tenant, offload.GrantSecret),
		deny("delete", "", "limitranges", tenant, offload.GrantSecret),
		deny("create", "", "events", tenant, ""),
		deny("create", "apps", "deployments", tenant, ""),
	)
	return cases
}

// Every grant and refusal of the consumer, asked of the real authorizer
// as the consumer's account with the groups its token carries.
func testConsumerAccess(t *testing.T, cp *harness.ControlPlane) {
	for _, tc := range consumerAccess() {
		t.Run(tc.String(), func(t *testing.T) {
			allowed, reason, err := tc.ask(t.Context(), cp.Client, consumerUser)
			if err != nil {
				t.Fatalf("SubjectAccessReview: %v", err)
			}
			if allowed != tc.allowed {
				t.Errorf("%s as the consumer: allowed=%v (%s), want %v", tc, allowed, reason, tc.allowed)
			}
		})
	}
}

// pod is a pod under the runtime's seccomp profile, as the policies want
// a consumer's, changed by changes.
func pod(name string, changes ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers:      []corev1.Container{{Name: "app", Image: "example.invalid/app"}},
		},
	}
	for _, change := range changes {
		change(p)
	}
	return p
}

func privileged(p *corev1.Pod) {
	yes := true
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &yes}
}

func privilegedInit(p *corev1.Pod) {
	yes := true
	p.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "example.invalid/setup", SecurityContext: &corev1.SecurityContext{Privileged: &yes}}}
}

func hostNetwork(p *corev1.Pod) { p.Spec.HostNetwork = true }
func hostPID(p *corev1.Pod)     { p.Spec.HostPID = true }
func hostIPC(p *corev1.Pod)     { p.Spec.HostIPC = true }

func hostPath(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "root", MountPath: "/host"}}
}

func hostPort(p *corev1.Pod) {
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
}

func netAdmin(p *corev1.Pod) {
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE", "NET_ADMIN"}}}
}

func baselineCapability(p *corev1.Pod) {
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}}}
}

func asConsumer(p *corev1.Pod) { p.Spec.ServiceAccountName = offload.ConsumerServiceAccount }

func noSeccomp(p *corev1.Pod) { p.Spec.SecurityContext = nil }

func unconfinedContainer(p *corev1.Pod) {
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
}

func onNode(p *corev1.Pod) { p.Spec.NodeName = "control-plane" }

func nfsVolume(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "share", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "192.0.2.1", Path: "/"}}}}
}

func localhostProfile(p *corev1.Pod) {
	profile := "profiles/app.json"
	p.Spec.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &profile}
}

func service(name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Port: 80}},
		},
	}
}

func configMap(name string, labels map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string]string{"k": "v"}}
}

// With the token the agent issued, the consumer makes in its tenant what
// offloading needs, and is refused everything else.
func (g *grant) testConsumerRequests(t *testing.T) {
	ctx := t.Context()
	consumer := kubernetes.NewForConfigOrDie(g.consumer)
	core := consumer.CoreV1()
	create := metav1.CreateOptions{}
	for _, a := range []struct {
		what string
		do   func(ctx context.Context) error
	}{
		{"create a pod", func(ctx context.Context) error {
			_, err := core.Pods(tenant).Create(ctx, pod("app"), create)
			return err
		}},
		{"create a pod with baseline capabilities", func(ctx context.Context) error {
			_, err := core.Pods(tenant).Create(ctx, pod("bind", baselineCapability), create)
			return err
		}},
		{"create a pod under a Localhost seccomp profile", func(ctx context.Context) error {
			_, err := core.Pods(tenant).Create(ctx, pod("localhost-seccomp", localhostProfile), create)
			return err
		}},
		{"create a ConfigMap", func(ctx context.Context) error {
			_, err := core.ConfigMaps(tenant).Create(ctx, configMap("app", nil), create)
			return err
		}},
		{"create a Secret", func(ctx context.Context) error {
			_, err := core.Secrets(tenant).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app"}, StringData: map[string]string{"k": "v"}}, create)
			return err
		}},
		{"create a ClusterIP Service", func(ctx context.Context) error {
			_, err := core.Services(tenant).Create(ctx, service("app", corev1.ServiceTypeClusterIP), create)
			return err
		}},
		{"create an EndpointSlice", func(ctx context.Context) error {
			port, proto := int32(80), corev1.ProtocolTCP
			slice := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "app-remote", Labels: map[string]string{discoveryv1.LabelServiceName: "app"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.70.0.5"}}},
				Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
			}
			_, err := consumer.DiscoveryV1().EndpointSlices(tenant).Create(ctx, slice, create)
			return err
		}},
		{"list its pods", func(ctx context.Context) error {
			_, err := core.Pods(tenant).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"read its ServiceAccount", func(ctx context.Context) error {
			_, err := core.ServiceAccounts(tenant).Get(ctx, offload.ConsumerServiceAccount, metav1.GetOptions{})
			return err
		}},
		{"list events", func(ctx context.Context) error {
			_, err := core.Events(tenant).List(ctx, metav1.ListOptions{})
			return err
		}},
	} {
		if err := a.do(ctx); err != nil {
			t.Errorf("the consumer may not %s: %v", a.what, err)
		}
	}

	impersonating := rest.CopyConfig(g.consumer)
	impersonating.Impersonate = rest.ImpersonationConfig{UserName: "admin", Groups: []string{"system:masters"}}
	for _, r := range []refusal{
		{"create a namespace", "", func(ctx context.Context) error {
			_, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mine"}}, create)
			return err
		}},
		{"list nodes", "", func(ctx context.Context) error {
			_, err := core.Nodes().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"read a Secret in default", "", func(ctx context.Context) error {
			_, err := core.Secrets("default").Get(ctx, "any", metav1.GetOptions{})
			return err
		}},
		{"create a Secret in default", "", func(ctx context.Context) error {
			_, err := core.Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, create)
			return err
		}},
		{"create a pod in flotilla-system", "", func(ctx context.Context) error {
			_, err := core.Pods(namespace).Create(ctx, pod("app"), create)
			return err
		}},
		{"bind itself a role", "", func(ctx context.Context) error {
			rb := roleBinding("more", "ClusterRole", "admin", consumerSubject())
			_, err := consumer.RbacV1().RoleBindings(tenant).Create(ctx, rb, create)
			return err
		}},
		{"create a Role", "", func(ctx context.Context) error {
			role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "more"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}}
			_, err := consumer.RbacV1().Roles(tenant).Create(ctx, role, create)
			return err
		}},
		{"issue itself a token", "", func(ctx context.Context) error {
			_, err := core.ServiceAccounts(tenant).CreateToken(ctx, offload.ConsumerServiceAccount, &authenticationv1.TokenRequest{}, create)
			return err
		}},
		{"lift its network fence", "", func(ctx context.Context) error {
			return consumer.NetworkingV1().NetworkPolicies(tenant).Delete(ctx, "flotilla-fence", metav1.DeleteOptions{})
		}},
		{"lift its quota", "", func(ctx context.Context) error {
			return core.ResourceQuotas(tenant).Delete(ctx, offload.GrantSecret, metav1.DeleteOptions{})
		}},
		{"impersonate an admin", "cannot impersonate", func(ctx context.Context) error {
			_, err := kubernetes.NewForConfigOrDie(impersonating).CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}},
	} {
		t.Run(r.what, func(t *testing.T) { r.check(t, "the consumer") })
	}
}

// The policies refuse the consumer's pods and Services that would give
// it the node, with a message that says why, while the same objects from
// an admin, in the same namespace, are accepted: the policies bind the
// consumer, not the cluster.
func (g *grant) testConsumerAdmission(t *testing.T) {
	consumer := kubernetes.NewForConfigOrDie(g.consumer).CoreV1()
	admin := g.cp.Client.CoreV1()
	create := metav1.CreateOptions{}
	createPod := func(p *corev1.Pod) func(context.Context, typedcorev1.CoreV1Interface) error {
		return func(ctx context.Context, c typedcorev1.CoreV1Interface) error {
			_, err := c.Pods(tenant).Create(ctx, p, create)
			return err
		}
	}
	createService := func(s *corev1.Service) func(context.Context, typedcorev1.CoreV1Interface) error {
		return func(ctx context.Context, c typedcorev1.CoreV1Interface) error {
			_, err := c.Services(tenant).Create(ctx, s, create)
			return err
		}
	}
	externalIP := service("external-ip", corev1.ServiceTypeClusterIP)
	externalIP.Spec.ExternalIPs = []string{"192.0.2.10"}
	externalName := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "external-name"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "kubernetes.default.svc.cluster.local"}}
	for _, tc := range []struct {
		what, why string
		create    func(context.Context, typedcorev1.CoreV1Interface) error
	}{
		{"a privileged pod", "may not run privileged containers on this cluster (app)", createPod(pod("privileged", privileged))},
		{"a pod with a privileged init container", "may not run privileged containers on this cluster (setup)", createPod(pod("privileged-init", privilegedInit))},
		{"a hostNetwork pod", "may not use the node's network (hostNetwork)", createPod(pod("host-network", hostNetwork))},
		{"a hostPID pod", "may not see the node's processes (hostPID)", createPod(pod("host-pid", hostPID))},
		{"a hostIPC pod", "may not share the node's IPC namespace (hostIPC)", createPod(pod("host-ipc", hostIPC))},
		{"a hostPath pod", "may not mount the node's files (hostPath volume root)", createPod(pod("host-path", hostPath))},
		{"a hostPort pod", "may not take ports of the node (hostPort in app)", createPod(pod("host-port", hostPort))},
		{"a pod adding NET_ADMIN", "may add only the baseline capabilities", createPod(pod("net-admin", netAdmin))},
		{"a pod running as flotilla-consumer", "may not run as the account flotilla-consumer", createPod(pod("as-consumer", asConsumer))},
		{"a pod without a seccomp profile", "run under a seccomp profile (app has none or Unconfined)", createPod(pod("no-seccomp", noSeccomp))},
		{"a container unconfined", "run under a seccomp profile (app has none or Unconfined)", createPod(pod("unconfined", unconfinedContainer))},
		{"a pod on a node of its choice", "may not place its pod on a node of its choice (spec.nodeName control-plane)", createPod(pod("on-node", onNode))},
		{"a pod with an NFS volume", "not share", createPod(pod("nfs", nfsVolume))},
		{"an ExternalName Service", "may not create ExternalName Services", createService(externalName)},
		{"a NodePort Service", "may not expose a Service on the nodes (type NodePort)", createService(service("node-port", corev1.ServiceTypeNodePort))},
		{"a LoadBalancer Service", "may not expose a Service on the nodes (type LoadBalancer)", createService(service("load-balancer", corev1.ServiceTypeLoadBalancer))},
		{"a Service with external IPs", "may not claim external IPs", createService(externalIP)},
		{"a never-expiring token Secret", "service-account-token", func(ctx context.Context, c typedcorev1.CoreV1Interface) error {
			_, err := c.Secrets(tenant).Create(ctx, tokenSecret("forever"), create)
			return err
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx := t.Context()
			refusal{"create " + tc.what, tc.why, func(ctx context.Context) error { return tc.create(ctx, consumer) }}.check(t, "the consumer")
			if err := tc.create(ctx, admin); err != nil {
				t.Errorf("an admin creates %s: %v", tc.what, err)
			}
		})
	}
}

// Our labels mark tenants and what the provider made: the consumer may
// neither put them on its objects nor change or remove them where the
// provider put them; its other labels, managed-by=Helm included, pass.
func (g *grant) testConsumerLabels(t *testing.T) {
	ctx := t.Context()
	consumer := kubernetes.NewForConfigOrDie(g.consumer).CoreV1()
	if _, err := g.cp.Client.CoreV1().ConfigMaps(tenant).Create(ctx, configMap("ours", tenantLabels(consumerID)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := consumer.ConfigMaps(tenant).Create(ctx, configMap("plain", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the consumer creates a ConfigMap: %v", err)
	}
	patch := func(name, labels string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := consumer.ConfigMaps(tenant).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":`+labels+`}}`), metav1.PatchOptions{})
			return err
		}
	}
	createWith := func(name string, labels map[string]string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := consumer.ConfigMaps(tenant).Create(ctx, configMap(name, labels), metav1.CreateOptions{})
			return err
		}
	}
	tenantLabel := "the label flotilla.io/tenant is the provider's"
	managedBy := "app.kubernetes.io/managed-by=flotilla marks the provider's objects"
	for _, tc := range []struct {
		what, why string // why empty: allowed
		do        func(context.Context) error
	}{
		{"create a ConfigMap labelled as a tenant's", tenantLabel, createWith("claims-tenant", map[string]string{offload.LabelTenant: consumerID})},
		{"create a ConfigMap labelled managed by flotilla", managedBy, createWith("claims-ours", map[string]string{"app.kubernetes.io/managed-by": "flotilla"})},
		{"create a Service labelled as a tenant's", tenantLabel, func(ctx context.Context) error {
			s := service("claims-tenant", corev1.ServiceTypeClusterIP)
			s.Labels = map[string]string{offload.LabelTenant: "cother"}
			_, err := consumer.Services(tenant).Create(ctx, s, metav1.CreateOptions{})
			return err
		}},
		{"add flotilla.io/tenant to its ConfigMap", tenantLabel, patch("plain", fmt.Sprintf(`{%q:%q}`, offload.LabelTenant, consumerID))},
		{"remove flotilla.io/tenant from ours", tenantLabel, patch("ours", fmt.Sprintf(`{%q:null}`, offload.LabelTenant))},
		{"change flotilla.io/tenant on ours", tenantLabel, patch("ours", fmt.Sprintf(`{%q:"cother"}`, offload.LabelTenant))},
		{"remove managed-by from ours", managedBy, patch("ours", `{"app.kubernetes.io/managed-by":null}`)},
		{"create a ConfigMap managed by Helm", "", createWith("helm", map[string]string{"app.kubernetes.io/managed-by": "Helm"})},
		{"label its ConfigMap", "", patch("plain", `{"app":"web"}`)},
		{"label ours, leaving our labels", "", patch("ours", `{"app":"web"}`)},
	} {
		t.Run(tc.what, func(t *testing.T) {
			if tc.why == "" {
				if err := tc.do(t.Context()); err != nil {
					t.Errorf("the consumer may not %s: %v", tc.what, err)
				}
				return
			}
			refusal{tc.what, tc.why, tc.do}.check(t, "the consumer")
		})
	}
	got, err := g.cp.Client.CoreV1().ConfigMaps(tenant).Get(ctx, "ours", metav1.GetOptions{})
	if err != nil || got.Labels[offload.LabelTenant] != consumerID || got.Labels["app"] != "web" {
		t.Errorf("ConfigMap ours after the consumer's patches: %v, %v", got.Labels, err)
	}
	if _, err := consumer.ConfigMaps(tenant).Get(ctx, "claims-tenant", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused ConfigMap claims-tenant: %v, want NotFound", err)
	}
}

package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/test/harness"
)

// consumerID is a cluster ID as identity makes them: 27 lowercase base32
// characters starting with 'c'.
const consumerID = "cq3x7bd2kfx6lmjwuq4ntr5yzea"

var (
	tenant       = offload.TenantNamespace(consumerID)
	consumerUser = offload.ConsumerUser(consumerID)
)

// grant is what the agent made for the consumer, shared by the subtests.
type grant struct {
	cp       *harness.ControlPlane
	agent    kubernetes.Interface
	consumer *rest.Config // the consumer's own token, as issued by the agent
	secret   *corev1.Secret
}

// TestGrants applies deploy/ to a real control plane and plays a grant
// with the parties' own tokens: the agent makes a tenant and issues the
// consumer a token; each is refused what docs/install.md says it may not
// do, by RBAC or by the admission policies; deleting the grant's Secret
// revokes the token. One control plane serves every subtest, in order.
func TestGrants(t *testing.T) {
	cp := installDeploy(t)

	g := &grant{cp: cp, agent: kubernetes.NewForConfigOrDie(agentConfig(t, cp))}
	t.Run("agent makes a tenant and issues a token", g.testSetup)
	if g.consumer == nil {
		t.Fatal("no grant to test further")
	}
	t.Run("agent is refused outside tenants", g.testAgentRefusals)
	t.Run("consumer grants and refusals", func(t *testing.T) { testConsumerAccess(t, cp) })
	t.Run("consumer requests with its own token", g.testConsumerRequests)
	t.Run("mirroring with the parties' own tokens", g.testMirroring)
	t.Run("admission refuses the consumer what it admits from an admin", g.testConsumerAdmission)
	t.Run("consumer may not touch our labels", g.testConsumerLabels)
	t.Run("agent writes only virtual nodes", g.testVirtualNodes)
	t.Run("agent writes only its own Services and EndpointSlices", g.testServiceObjects)
	t.Run("red team: the agent's token does not make a cluster admin", g.testAgentRedTeam)
	t.Run("deleting the grant's Secret revokes the token", g.testRevoke)
}

// installDeploy applies deploy/ to a new control plane as an operator
// does (`kubectl apply --server-side -k`) and waits until every policy
// type-checks and refuses a request it exists for.
func installDeploy(t *testing.T) *harness.ControlPlane {
	t.Helper()
	harness.Require(t, harness.NeedsControlPlane...)
	cp := harness.New(t).ControlPlane("cp", harness.ControlPlaneOptions{})
	if out, err := kubectl(cp, "apply", "--server-side", "-k", "."); err != nil {
		t.Fatalf("kubectl apply -k deploy/: %v\n%s", err, out)
	}
	checkPoliciesCompile(t, cp)
	waitPoliciesEnforced(t, cp)
	return cp
}

// checkPoliciesCompile fails when an expression of a policy in
// admission.yaml does not type-check against the kinds it matches: such
// an expression fails at admission, refusing everything it matches.
func checkPoliciesCompile(t *testing.T, cp *harness.ControlPlane) {
	t.Helper()
	vaps := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	list, err := vaps.List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=flotilla"})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("list ValidatingAdmissionPolicies: %v (%d); is admissionregistration.k8s.io/v1 served?", err, len(list.Items))
	}
	for _, p := range list.Items {
		var checked admissionregistrationv1.ValidatingAdmissionPolicy
		eventually.Within(t, 30*time.Second, "policy "+p.Name+" type-checked", func() error {
			got, err := vaps.Get(t.Context(), p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Status.ObservedGeneration != got.Generation || got.Status.TypeChecking == nil {
				return fmt.Errorf("status %+v of generation %d", got.Status, got.Generation)
			}
			checked = *got
			return nil
		})
		for _, w := range checked.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("policy %s: %s: %s", p.Name, w.FieldRef, w.Warning)
		}
	}
}

// waitPoliciesEnforced waits until every policy refuses a request it
// exists for, made impersonating the party it binds: the API server loads
// new policies and bindings in the background, and a refusal tested
// before would prove nothing. The requests go to a tenant namespace of a
// made-up consumer where the consumer's account is bound too, so that
// RBAC lets them through to admission and each one is refused by one
// policy only; all but the token are dry runs.
func waitPoliciesEnforced(t *testing.T, cp *harness.ControlPlane) {
	t.Helper()
	ctx := t.Context()
	witness := offload.TenantNamespace("cwitness")
	admin := cp.Client
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: witness, Labels: tenantLabels("cwitness")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.CoreV1().Namespaces().Delete(ctx, witness, metav1.DeleteOptions{})
	if _, err := admin.CoreV1().ServiceAccounts(witness).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: offload.ConsumerServiceAccount}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(witness).Create(ctx, roleBinding(offload.ConsumerClusterRole, "ClusterRole", offload.ConsumerClusterRole, consumerSubject()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	as := func(user string) kubernetes.Interface {
		cfg := rest.CopyConfig(cp.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	agent, consumer := as(agentUser), as(consumerUser)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, w := range []struct {
		policy string
		do     func() error
	}{
		{"flotilla-consumer-pods", func() error {
			_, err := consumer.CoreV1().Pods(witness).Create(ctx, pod("witness", hostNetwork), dry)
			return err
		}},
		{"flotilla-consumer-services", func() error {
			_, err := consumer.CoreV1().Services(witness).Create(ctx, service("witness", corev1.ServiceTypeNodePort), dry)
			return err
		}},
		{"flotilla-consumer-endpointslices", func() error {
			_, err := consumer.DiscoveryV1().EndpointSlices(witness).Create(ctx, routedSlice("witness", "10.70.0.5"), dry)
			return err
		}},
		{"flotilla-consumer-labels", func() error {
			_, err := consumer.CoreV1().ConfigMaps(witness).Create(ctx, configMap("witness", map[string]string{offload.LabelTenant: consumerID}), dry)
			return err
		}},
		{"flotilla-no-token-secrets", func() error {
			_, err := consumer.CoreV1().Secrets(witness).Create(ctx, tokenSecret("witness"), dry)
			return err
		}},
		{"flotilla-agent-namespaces", func() error {
			_, err := agent.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "witness"}}, dry)
			return err
		}},
		{"flotilla-agent-tenant-objects", func() error {
			_, err := agent.CoreV1().Secrets("default").Create(ctx, grantSecret(), dry)
			return err
		}},
		{"flotilla-agent-rolebindings", func() error {
			everyone := rbacv1.Subject{Kind: "Group", APIGroup: rbacv1.GroupName, Name: "system:authenticated"}
			_, err := agent.RbacV1().RoleBindings(witness).Create(ctx, roleBinding("witness", "ClusterRole", offload.ConsumerClusterRole, everyone), dry)
			return err
		}},
		{"flotilla-agent-virtual-nodes", func() error {
			_, err := agent.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "witness"}, Spec: virtualNodeSpec()}, dry)
			return err
		}},
		{"flotilla-agent-virtual-node-taint", func() error {
			_, err := agent.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: offload.VirtualNodeName("cwitness"), Labels: virtualNodeLabels()}}, dry)
			return err
		}},
		{"flotilla-agent-service-objects", func() error {
			_, err := agent.CoreV1().Services(witness).Create(ctx, service("witness", corev1.ServiceTypeClusterIP), dry)
			return err
		}},
		{"flotilla-agent-tokens", func() error {
			_, err := agent.CoreV1().ServiceAccounts(witness).CreateToken(ctx, offload.ConsumerServiceAccount, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
			return err
		}},
	} {
		eventually.Within(t, 30*time.Second, "policy "+w.policy+" enforced", func() error {
			if err := w.do(); err == nil || !strings.Contains(err.Error(), "'"+w.policy+"'") {
				return fmt.Errorf("witness request: %v", err)
			}
			return nil
		})
	}
}

func tenantLabels(consumer string) map[string]string {
	return map[string]string{offload.LabelTenant: consumer, "app.kubernetes.io/managed-by": "flotilla"}
}

// tenantNamespaceLabels are a consumer's namespace's labels as the agent
// writes them: the tenant's, and Pod Security restricted.
func tenantNamespaceLabels(consumer string) map[string]string {
	l := tenantLabels(consumer)
	l[tenancy.LabelPodSecurityEnforce] = tenancy.PodSecurityRestricted
	return l
}

func grantSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: offload.GrantSecret, Labels: tenantLabels(consumerID)},
		Type:       "flotilla.io/grant",
	}
}

func tokenSecret(name string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{corev1.ServiceAccountNameKey: offload.ConsumerServiceAccount}},
		Type:       corev1.SecretTypeServiceAccountToken,
	}
}

func consumerSubject() rbacv1.Subject {
	return rbacv1.Subject{Kind: "ServiceAccount", Name: offload.ConsumerServiceAccount, Namespace: tenant}
}

func roleBinding(name, kind, role string, subjects ...rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: tenantLabels(consumerID)},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role},
		Subjects:   subjects,
	}
}

// The agent, with its own token, makes the tenant of the design and
// issues the consumer a token bound to the grant's Secret, which works.
func (g *grant) testSetup(t *testing.T) {
	ctx := t.Context()
	core := g.agent.CoreV1()
	// The endpoint networks: where the consumer's EndpointSlices may point
	// (its view, 10.70.0.0/16, holds the one testConsumerRequests makes).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant, Labels: tenantNamespaceLabels(consumerID),
		Annotations: map[string]string{tenancy.AnnotationEndpointNetworks: "10.70.0.0/16"}}}
	if _, err := core.Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("agent creates the tenant namespace: %v", err)
	}
	// The admin lowers Pod Security here, so that the subtests below try
	// the policies on their own (TestTenantFence tries Pod Security; the
	// mirroring subtest that the agent may not lower it).
	lower := `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"privileged"}}}`
	if _, err := g.cp.Client.CoreV1().Namespaces().Patch(ctx, tenant, types.MergePatchType, []byte(lower), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: offload.ConsumerServiceAccount, Labels: tenantLabels(consumerID)}}
	if _, err := core.ServiceAccounts(tenant).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("agent creates the consumer's ServiceAccount: %v", err)
	}
	rb := roleBinding(offload.ConsumerClusterRole, "ClusterRole", offload.ConsumerClusterRole, consumerSubject())
	if _, err := g.agent.RbacV1().RoleBindings(tenant).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("agent binds flotilla-consumer: %v", err)
	}
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: offload.GrantSecret, Labels: tenantLabels(consumerID)},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			corev1.ResourceRequestsCPU:    resource.MustParse("4"),
			corev1.ResourceRequestsMemory: resource.MustParse("4Gi"),
			corev1.ResourcePods:           resource.MustParse("30"),
		}},
	}
	if _, err := core.ResourceQuotas(tenant).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatalf("agent creates the grant's ResourceQuota: %v", err)
	}
	limits := &corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: offload.GrantSecret, Labels: tenantLabels(consumerID)},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type:           corev1.LimitTypeContainer,
			DefaultRequest: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		}}},
	}
	if _, err := core.LimitRanges(tenant).Create(ctx, limits, metav1.CreateOptions{}); err != nil {
		t.Fatalf("agent creates the grant's LimitRange: %v", err)
	}
	secret, err := core.Secrets(tenant).Create(ctx, grantSecret(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("agent creates the Secret flotilla-grant: %v", err)
	}
	g.secret = secret
	// Server-side apply is how an agent keeps its objects current; it
	// needs no get.
	apply := fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":%q,"labels":{%q:%q,"app.kubernetes.io/managed-by":"flotilla"}},"type":"flotilla.io/grant"}`,
		offload.GrantSecret, offload.LabelTenant, consumerID)
	if _, err := core.Secrets(tenant).Patch(ctx, offload.GrantSecret, types.ApplyPatchType, []byte(apply), metav1.PatchOptions{FieldManager: "flotilla-agent"}); err != nil {
		t.Fatalf("agent applies the Secret flotilla-grant: %v", err)
	}

	expiry := int64(600)
	tr, err := core.ServiceAccounts(tenant).CreateToken(ctx, offload.ConsumerServiceAccount, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &expiry,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: offload.GrantSecret, UID: secret.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("agent issues a token for flotilla-consumer: %v", err)
	}
	g.consumer = &rest.Config{Host: g.cp.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: g.cp.Config.CAData}}
	review, err := kubernetes.NewForConfigOrDie(g.consumer).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the consumer's token: %v", err)
	}
	if got := review.Status.UserInfo.Username; got != consumerUser {
		t.Fatalf("the consumer's token authenticates as %q, want %q", got, consumerUser)
	}
}

// refusal is a request that must be Forbidden, with a message that names
// why (empty: any Forbidden).
type refusal struct {
	what, why string
	do        func(ctx context.Context) error
}

func (r refusal) check(t *testing.T, as string) {
	t.Helper()
	err := r.do(t.Context())
	if !apierrors.IsForbidden(err) {
		t.Fatalf("%s may %s: got %v, want Forbidden", as, r.what, err)
	}
	if !strings.Contains(err.Error(), r.why) {
		t.Errorf("%s may not %s, but the message does not say %q: %v", as, r.what, r.why, err)
	}
}

// With its own token the agent may not leave the tenants it labelled:
// RBAC refuses what it has no verb for, the policies what its verbs would
// reach outside tenant namespaces.
func (g *grant) testAgentRefusals(t *testing.T) {
	ctx := t.Context()
	admin := g.cp.Client
	core, rbac := g.agent.CoreV1(), g.agent.RbacV1()
	// Things the agent could reach without the policies: a ClusterRole
	// it holds every rule of (RBAC lets it bind that), and an account
	// named like the consumer's outside any tenant.
	subset := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-test-node-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}},
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, subset, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lookalike := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: offload.ConsumerServiceAccount}}
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, lookalike, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	others := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "payments"}}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, others, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := func(name string) *authenticationv1.TokenRequest {
		return &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: name},
		}}
	}
	create := metav1.CreateOptions{}
	notTenant := "only in tenant namespaces"
	labelPatch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q,"app.kubernetes.io/managed-by":"flotilla"}}}`, offload.LabelTenant, consumerID)

	for _, r := range []refusal{
		{"create a namespace without the tenant labels", "may create only tenant namespaces", func(ctx context.Context) error {
			_, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: offload.TenantNamespace("cother")}}, create)
			return err
		}},
		{"create a labelled namespace under another name", "is named " + tenant, func(ctx context.Context) error {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: tenantNamespaceLabels(consumerID)}}
			_, err := core.Namespaces().Create(ctx, ns, create)
			return err
		}},
		// Kubernetes refuses these two to everyone (NamespaceLifecycle)
		// before the policies are asked; the next ones are ours to refuse.
		{"delete default", "", func(ctx context.Context) error {
			return core.Namespaces().Delete(ctx, "default", metav1.DeleteOptions{})
		}},
		{"delete kube-system", "", func(ctx context.Context) error {
			return core.Namespaces().Delete(ctx, "kube-system", metav1.DeleteOptions{})
		}},
		{"delete a namespace of someone else's", "namespace " + others.Name + " is not one", func(ctx context.Context) error {
			return core.Namespaces().Delete(ctx, others.Name, metav1.DeleteOptions{})
		}},
		{"delete its own namespace", "namespace " + namespace + " is not one", func(ctx context.Context) error {
			return core.Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
		}},
		{"label default as a tenant", "namespace default is not one", func(ctx context.Context) error {
			_, err := core.Namespaces().Patch(ctx, "default", types.MergePatchType, []byte(labelPatch), metav1.PatchOptions{})
			return err
		}},
		{"take the tenant labels off a tenant namespace", "may not remove the tenant labels", func(ctx context.Context) error {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, offload.LabelTenant)
			_, err := core.Namespaces().Patch(ctx, tenant, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}},
		{"bind cluster-admin in a tenant", "not currently held", func(ctx context.Context) error {
			_, err := rbac.RoleBindings(tenant).Create(ctx, roleBinding("escape", "ClusterRole", "cluster-admin", consumerSubject()), create)
			return err
		}},
		{"bind a role it holds every rule of", "may bind only the ClusterRole flotilla-consumer", func(ctx context.Context) error {
			_, err := rbac.RoleBindings(tenant).Create(ctx, roleBinding("escape", "ClusterRole", subset.Name, consumerSubject()), create)
			return err
		}},
		{"bind flotilla-consumer to every authenticated user", "only to the ServiceAccount flotilla-consumer", func(ctx context.Context) error {
			everyone := rbacv1.Subject{Kind: "Group", APIGroup: rbacv1.GroupName, Name: "system:authenticated"}
			_, err := rbac.RoleBindings(tenant).Create(ctx, roleBinding("escape", "ClusterRole", offload.ConsumerClusterRole, everyone), create)
			return err
		}},
		// Outside a tenant no subject is the namespace's consumer either:
		// two policies refuse it, either may answer.
		{"bind flotilla-consumer outside a tenant", "ValidatingAdmissionPolicy 'flotilla-agent-", func(ctx context.Context) error {
			_, err := rbac.RoleBindings("default").Create(ctx, roleBinding("escape", "ClusterRole", offload.ConsumerClusterRole, consumerSubject()), create)
			return err
		}},
		{"create a Secret in default", notTenant, func(ctx context.Context) error {
			_, err := core.Secrets("default").Create(ctx, grantSecret(), create)
			return err
		}},
		{"create a never-expiring token Secret in a tenant", "service-account-token", func(ctx context.Context) error {
			_, err := core.Secrets(tenant).Create(ctx, tokenSecret("forever"), create)
			return err
		}},
		{"issue a token for another account", "", func(ctx context.Context) error {
			_, err := core.ServiceAccounts(tenant).CreateToken(ctx, "default", bound(offload.GrantSecret), create)
			return err
		}},
		{"issue a token for flotilla-viewer, the metrics ports' reader", "", func(ctx context.Context) error {
			_, err := core.ServiceAccounts(namespace).CreateToken(ctx, "flotilla-viewer", &authenticationv1.TokenRequest{}, create)
			return err
		}},
		{"issue a token for flotilla-consumer outside a tenant", notTenant, func(ctx context.Context) error {
			_, err := core.ServiceAccounts("default").CreateToken(ctx, offload.ConsumerServiceAccount, bound(offload.GrantSecret), create)
			return err
		}},
		{"issue a token the grant's Secret does not revoke", "bound to the Secret flotilla-grant", func(ctx context.Context) error {
			_, err := core.ServiceAccounts(tenant).CreateToken(ctx, offload.ConsumerServiceAccount, &authenticationv1.TokenRequest{}, create)
			return err
		}},
		{"change its own ServiceAccount", notTenant, func(ctx context.Context) error {
			_, err := core.ServiceAccounts(namespace).Patch(ctx, serviceAccount, types.MergePatchType, []byte(labelPatch), metav1.PatchOptions{})
			return err
		}},
		{"set a quota in kube-system", notTenant, func(ctx context.Context) error {
			_, err := core.ResourceQuotas("kube-system").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "escape"}}, create)
			return err
		}},
		{"delete an account outside a tenant", notTenant, func(ctx context.Context) error {
			return core.ServiceAccounts("default").Delete(ctx, offload.ConsumerServiceAccount, metav1.DeleteOptions{})
		}},
		{"cut kube-system off with a NetworkPolicy", notTenant, func(ctx context.Context) error {
			deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: tenancy.FencePolicy},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}}
			_, err := g.agent.NetworkingV1().NetworkPolicies("kube-system").Create(ctx, deny, create)
			return err
		}},
		{"set limits in default", notTenant, func(ctx context.Context) error {
			_, err := core.LimitRanges("default").Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "escape"}}, create)
			return err
		}},
	} {
		t.Run(r.what, func(t *testing.T) { r.check(t, "the agent") })
	}
	for _, ns := range []string{"default", "kube-system", namespace, others.Name} {
		if got, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil {
			t.Errorf("namespace %s after the agent's refused delete: %v, %v", ns, err, got)
		}
	}
}

// Deleting the Secret flotilla-grant, as the agent does first on
// revocation, makes the consumer's token fail authentication (401) once
// the API server's token cache lets go of it.
func (g *grant) testRevoke(t *testing.T) {
	ctx := t.Context()
	consumer := kubernetes.NewForConfigOrDie(g.consumer)
	review := func() error {
		_, err := consumer.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		return err
	}
	if err := review(); err != nil {
		t.Fatalf("the consumer's token before revocation: %v", err)
	}
	if err := g.agent.CoreV1().Secrets(tenant).Delete(ctx, offload.GrantSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("agent deletes the Secret flotilla-grant: %v", err)
	}
	took := eventually.Within(t, 60*time.Second, "the consumer's token refused after revocation", func() error {
		if err := review(); !apierrors.IsUnauthorized(err) {
			return fmt.Errorf("SelfSubjectReview with the revoked token: %v, want 401 Unauthorized", err)
		}
		return nil
	})
	t.Logf("the revoked token got 401 %s after the Secret was deleted", took.Round(time.Millisecond))
	if _, err := consumer.CoreV1().Pods(tenant).List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("list pods with the revoked token: %v, want 401 Unauthorized", err)
	}
}

// Namespace mirroring with the parties' own tokens: the consumer asks in
// its tenant namespace and may not answer itself or make the namespace;
// the agent may make a mirrored namespace, labelled as the consumer's,
// under a name that is not reserved, and no other.
func (g *grant) testMirroring(t *testing.T) {
	ctx := t.Context()
	gvr := v1alpha1.GroupVersion.WithResource("namespacerequests")
	consumer := dynamic.NewForConfigOrDie(g.consumer).Resource(gvr).Namespace(tenant)
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "NamespaceRequest",
		"metadata": map[string]any{"name": "shop-q3x7bd", "labels": map[string]any{v1alpha1.LabelMirroredFrom: "shop"}},
		"spec":     map[string]any{"sourceNamespace": "shop"},
	}}
	created, err := consumer.Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the consumer creates a NamespaceRequest in its tenant namespace: %v", err)
	}
	if _, err := consumer.Get(ctx, created.GetName(), metav1.GetOptions{}); err != nil {
		t.Errorf("the consumer reads its request back: %v", err)
	}
	status := created.DeepCopy()
	if err := unstructured.SetNestedField(status.Object, "Created", "status", "phase"); err != nil {
		t.Fatal(err)
	}
	_, err = consumer.UpdateStatus(ctx, status, metav1.UpdateOptions{})
	refusal{"write its request's status", "", func(context.Context) error { return err }}.check(t, "the consumer")
	_, err = consumer.Patch(ctx, created.GetName(), types.MergePatchType, []byte(`{"status":{"phase":"Created"}}`), metav1.PatchOptions{}, "status")
	refusal{"patch its request's status", "", func(context.Context) error { return err }}.check(t, "the consumer")
	if err := consumer.Delete(ctx, created.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Errorf("the consumer deletes its request: %v", err)
	}
	_, err = kubernetes.NewForConfigOrDie(g.consumer).CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop-q3x7bd", Labels: mirroredLabels("shop")}}, metav1.CreateOptions{})
	refusal{"create the namespace itself", "", func(context.Context) error { return err }}.check(t, "the consumer")

	agent := g.agent.CoreV1().Namespaces()
	mirrored, err := agent.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop-q3x7bd", Labels: mirroredLabels("shop")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the agent creates a mirrored namespace: %v", err)
	}
	// A consumer's namespace stays at Pod Security restricted.
	for what, patch := range map[string]string{
		"lower a mirrored namespace's Pod Security":  `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"privileged"}}}`,
		"take Pod Security off a mirrored namespace": `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":null}}}`,
	} {
		_, err := agent.Patch(ctx, mirrored.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		refusal{what, "keeps a consumer's namespaces at Pod Security restricted", func(context.Context) error { return err }}.check(t, "the agent")
	}
	if err := agent.Delete(ctx, mirrored.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the agent deletes the mirrored namespace it made: %v", err)
	}
	for _, name := range []string{"kube-foo", "default", "flotilla-system", "openshift-config"} {
		_, err := agent.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: mirroredLabels("shop")}}, metav1.CreateOptions{})
		refusal{"create a mirrored namespace named " + name, "under the reserved name " + name, func(context.Context) error { return err }}.check(t, "the agent")
	}
}

func mirroredLabels(source string) map[string]string {
	l := tenantNamespaceLabels(consumerID)
	l[v1alpha1.LabelMirroredFrom] = source
	return l
}

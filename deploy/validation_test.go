package deploy

import (
	"fmt"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	flotillav1 "github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/test/harness"
)

// The CRDs refuse what no agent could act on: a remoteName that is not a
// DNS label, a negative limit, a selector too large to be a rule. Each
// refusal is asked with the credential of the one who would write it (a
// namespace's user for a NamespaceOffload, the cluster's admin for a
// Peer), after the same account was seen writing a valid object.
func TestCRDValidation(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("cp", harness.ControlPlaneOptions{})
	if err := harness.ApplyCRDs(t.Context(), cp.Config, CRDs, "crds/flotilla.io_*.yaml"); err != nil {
		t.Fatal(err)
	}
	user := namespaceUser(t, cp, "shop")
	offloads := dynamic.NewForConfigOrDie(user).Resource(flotillav1.GroupVersion.WithResource("namespaceoffloads")).Namespace("shop")
	peers := dynamic.NewForConfigOrDie(cp.Config).Resource(peerGVR)

	selector := func(labels, expressions, values int) *metav1.LabelSelector {
		s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
		for i := range labels {
			s.MatchLabels[fmt.Sprintf("k%d", i)] = "v"
		}
		for i := range expressions {
			e := metav1.LabelSelectorRequirement{Key: fmt.Sprintf("e%d", i), Operator: metav1.LabelSelectorOpIn}
			for j := range values {
				e.Values = append(e.Values, fmt.Sprintf("v%d", j))
			}
			s.MatchExpressions = append(s.MatchExpressions, e)
		}
		return s
	}
	selected := func(name string) flotillav1.NamespaceOffloadSpec {
		return flotillav1.NamespaceOffloadSpec{NamespaceMapping: flotillav1.MappingSelected, RemoteName: name}
	}
	limits := func(cpu, memory string) flotillav1.PeerSpec {
		l := &flotillav1.OffloadLimits{}
		if cpu != "" {
			q := resource.MustParse(cpu)
			l.CPU = &q
		}
		if memory != "" {
			q := resource.MustParse(memory)
			l.Memory = &q
		}
		return flotillav1.PeerSpec{OffloadLimits: l}
	}

	offloadCases := []struct {
		name    string
		spec    flotillav1.NamespaceOffloadSpec
		refused string // a part of the API server's message; empty: accepted
	}{
		{"a DNS label", selected("shop-eu-1"), ""},
		{"the largest selector", flotillav1.NamespaceOffloadSpec{ClusterSelector: selector(32, 16, 64)}, ""},
		{"upper case", selected("Shop"), "remoteName must be a DNS label"},
		{"a dot", selected("shop.eu"), "remoteName must be a DNS label"},
		{"a leading dash", selected("-shop"), "remoteName must be a DNS label"},
		{"an underscore", selected("shop_eu"), "remoteName must be a DNS label"},
		{"33 matchLabels", flotillav1.NamespaceOffloadSpec{ClusterSelector: selector(33, 0, 0)}, "at most 32 matchLabels"},
		{"17 matchExpressions", flotillav1.NamespaceOffloadSpec{ClusterSelector: selector(0, 17, 1)}, "at most 16 matchExpressions"},
		{"65 values", flotillav1.NamespaceOffloadSpec{ClusterSelector: selector(0, 1, 65)}, "at most 64 values"},
	}
	for _, tc := range offloadCases {
		t.Run("NamespaceOffload with "+tc.name, func(t *testing.T) {
			obj := toUnstructured(t, &flotillav1.NamespaceOffload{
				TypeMeta:   metav1.TypeMeta{APIVersion: flotillav1.GroupVersion.String(), Kind: "NamespaceOffload"},
				ObjectMeta: metav1.ObjectMeta{Name: "offload"},
				Spec:       tc.spec,
			})
			_, err := offloads.Create(t.Context(), obj, metav1.CreateOptions{})
			checkValidation(t, err, tc.refused)
			if err == nil {
				if err := offloads.Delete(t.Context(), "offload", metav1.DeleteOptions{}); err != nil {
					t.Fatalf("delete the accepted NamespaceOffload: %v", err)
				}
			}
		})
	}

	peerCases := []struct {
		name    string
		spec    flotillav1.PeerSpec
		refused string
	}{
		{"zero limits", limits("0", "0"), ""},
		{"positive limits", limits("2500m", "4Gi"), ""},
		{"a negative cpu", limits("-1", ""), "cpu must not be negative"},
		{"a negative memory", limits("", "-1Mi"), "memory must not be negative"},
	}
	for i, tc := range peerCases {
		t.Run("Peer with "+tc.name, func(t *testing.T) {
			obj := toUnstructured(t, &flotillav1.Peer{
				TypeMeta:   metav1.TypeMeta{APIVersion: flotillav1.GroupVersion.String(), Kind: "Peer"},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-limits-%d", i)},
				Spec:       tc.spec,
			})
			_, err := peers.Create(t.Context(), obj, metav1.CreateOptions{})
			checkValidation(t, err, tc.refused)
		})
	}

	// A negative pod count was refused by the schema before; an update
	// is checked as a create is.
	t.Run("Peer updated to a negative memory", func(t *testing.T) {
		got, err := peers.Get(t.Context(), "c-limits-1", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the accepted Peer: %v", err)
		}
		if err := unstructured.SetNestedField(got.Object, "-4Gi", "spec", "offloadLimits", "memory"); err != nil {
			t.Fatal(err)
		}
		_, err = peers.Update(t.Context(), got, metav1.UpdateOptions{})
		checkValidation(t, err, "memory must not be negative")
	})
}

// checkValidation fails unless err is nil where refused is empty, or an
// Invalid error naming refused otherwise.
func checkValidation(t *testing.T, err error, refused string) {
	t.Helper()
	switch {
	case refused == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case refused == "":
		t.Logf("accepted")
	case err == nil:
		t.Fatalf("accepted; want refused with %q", refused)
	case !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), refused):
		t.Fatalf("refused with %v; want Invalid with %q", err, refused)
	default:
		t.Logf("refused: %v", err)
	}
}

// namespaceUser makes namespace ns and a ServiceAccount in it that may
// write NamespaceOffloads there and nothing else, and returns a client
// config with its token.
func namespaceUser(t *testing.T, cp *harness.ControlPlane, ns string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	core := cp.Client.CoreV1()
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rbac := cp.Client.RbacV1()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "offloader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{flotillav1.GroupVersion.Group}, Resources: []string{"namespaceoffloads"},
			Verbs: []string{"get", "create", "update", "delete"}}},
	}
	if _, err := rbac.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "offloader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "offloader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "owner", Namespace: ns}},
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(600)
	tr, err := core.ServiceAccounts(ns).CreateToken(ctx, "owner",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/owner: %v", ns, err)
	}
	return &rest.Config{Host: cp.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.Config.CAData}}
}

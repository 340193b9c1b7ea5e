package deploy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/fabric/fabricapi"
	"github.com/flotilla-io/flotilla/ha"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/test/harness"
)

// podTokenConfig is the agent's token as its pod gets it: bound to the
// pod, so the API server names the pod (name and UID) in the token.
func podTokenConfig(t *testing.T, cp *harness.ControlPlane, pod corev1.Pod) *rest.Config {
	t.Helper()
	expiry := int64(600)
	tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s bound to pod %s: %v", serviceAccount, pod.Name, err)
	}
	return &rest.Config{Host: cp.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.Config.CAData}}
}

// testGatewayRole: with the token of its own pod each replica labels that
// pod active and takes the label off the other, and the clusterset DNS
// Service selects that pod only; a replica may not label the other's pod, nor
// change anything else of a pod, nor label a pod with a token bound to
// none, nor have its fabric's pods carry the label.
func testGatewayRole(t *testing.T, cp *harness.ControlPlane) {
	ctx := t.Context()
	pods, err := agentPods(ctx, cp)
	if err != nil || len(pods) != 2 {
		t.Fatalf("agent pods: %s, err %v; want two", describePods(pods), err)
	}
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	first, second := pods[0], pods[1]
	asFirst := kubernetes.NewForConfigOrDie(podTokenConfig(t, cp, first))
	asSecond := kubernetes.NewForConfigOrDie(podTokenConfig(t, cp, second))
	unbound := kubernetes.NewForConfigOrDie(agentConfig(t, cp))
	setRole := func(kube kubernetes.Interface, pod, value string, dry bool) func(context.Context) error {
		return func(ctx context.Context) error {
			opts := metav1.PatchOptions{}
			if dry {
				opts.DryRun = []string{metav1.DryRunAll}
			}
			_, err := kube.CoreV1().Pods(namespace).Patch(ctx, pod, types.MergePatchType,
				[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, ha.RoleLabel, value)), opts)
			return err
		}
	}
	// The policy loads in the background: wait until it refuses.
	eventually.Within(t, 30*time.Second, "policy flotilla-agent-pods enforced on the role label", func() error {
		err := setRole(asFirst, second.Name, ha.RoleActive, true)(ctx)
		if err == nil || !containsPolicy(err, "flotilla-agent-pods") {
			return fmt.Errorf("dry-run label of the other replica's pod: %v", err)
		}
		return nil
	})

	labelled := func() ([]string, error) {
		list, err := cp.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: ha.RoleLabel + "=" + ha.RoleActive})
		if err != nil {
			return nil, err
		}
		var names []string
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		return names, nil
	}
	// The pods the Service selects (the pretend kubelet gives host-network
	// pods the loopback address, which an EndpointSlice may not hold).
	served := func() ([]string, error) {
		svc, err := cp.Client.CoreV1().Services(namespace).Get(ctx, "flotilla-clusterset-dns", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		list, err := cp.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(svc.Spec.Selector).String()})
		if err != nil {
			return nil, err
		}
		var names []string
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		return names, nil
	}
	expect := func(what string, want ...string) {
		t.Helper()
		eventually.Within(t, 30*time.Second, what, func() error {
			l, err := labelled()
			if err != nil || fmt.Sprint(l) != fmt.Sprint(want) {
				return fmt.Errorf("pods labelled %s=%s: %v (%v), want %v", ha.RoleLabel, ha.RoleActive, l, err, want)
			}
			s, err := served()
			if err != nil || fmt.Sprint(s) != fmt.Sprint(want) {
				return fmt.Errorf("flotilla-clusterset-dns selects %v (%v), want %v", s, err, want)
			}
			return nil
		})
	}

	// The legitimate writes, each with the token of the replica's own pod.
	if err := (&ha.Role{Kube: asFirst, Namespace: namespace, Pod: first.Name}).MarkActive(ctx); err != nil {
		t.Fatalf("the first replica labels its own pod active: %v", err)
	}
	expect("the first replica active", first.Name)
	if err := (&ha.Role{Kube: asSecond, Namespace: namespace, Pod: second.Name}).MarkActive(ctx); err != nil {
		t.Fatalf("the second replica labels its own pod active and takes the label off the first: %v", err)
	}
	expect("the second replica active, the first not", second.Name)

	before, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, first.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bystander := pod("bystander")
	bystander.Namespace = namespace
	if _, err := cp.Client.CoreV1().Pods(namespace).Create(ctx, bystander, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cp.Client.CoreV1().Pods(namespace).Delete(context.Background(), bystander.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	owner, err := cp.Client.AppsV1().Deployments(namespace).Get(ctx, "flotilla-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ownPodOnly := "may set flotilla.io/gateway-role=active only on its own pod"
	for _, r := range []refusal{
		{"label the other replica's pod active", ownPodOnly, setRole(asFirst, second.Name, ha.RoleActive, false)},
		{"label its own pod with another role", ownPodOnly, setRole(asFirst, first.Name, "primary", false)},
		{"label a pod active with a token bound to no pod", ownPodOnly, setRole(unbound, first.Name, ha.RoleActive, false)},
		{"change another label of its own pod", "may change only the label flotilla.io/gateway-role", func(ctx context.Context) error {
			_, err := asFirst.CoreV1().Pods(namespace).Patch(ctx, first.Name, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"app.kubernetes.io/component":"other"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"annotate its own pod", "may change only the label flotilla.io/gateway-role", func(ctx context.Context) error {
			_, err := asFirst.CoreV1().Pods(namespace).Patch(ctx, first.Name, types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"example.org/x":"y"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"label a pod of its namespace that is not the agent's", "only pods bound to its virtual nodes", setRole(asFirst, bystander.Name, ha.RoleActive, false)},
		{"label a pod of another namespace", `cannot patch resource "pods"`, func(ctx context.Context) error {
			_, err := asFirst.CoreV1().Pods("default").Patch(ctx, "any", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"delete the other replica's pod", "only pods bound to its virtual nodes", func(ctx context.Context) error {
			return asFirst.CoreV1().Pods(namespace).Delete(ctx, second.Name, metav1.DeleteOptions{})
		}},
		{"label its fabric's pods active", "labels no pod flotilla.io/gateway-role", func(ctx context.Context) error {
			ds, err := fabricapi.DaemonSet(owner)
			if err != nil {
				return err
			}
			ds.Spec.Template.WithLabels(map[string]string{ha.RoleLabel: ha.RoleActive})
			_, err = asFirst.AppsV1().DaemonSets(namespace).Apply(ctx, ds, metav1.ApplyOptions{FieldManager: fabricapi.FieldManager, Force: true, DryRun: []string{metav1.DryRunAll}})
			return err
		}},
	} {
		r.check(t, "the agent")
		t.Logf("refused: %s", r.what)
	}
	after, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, first.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after.Labels) != fmt.Sprint(before.Labels) || len(after.Annotations) != len(before.Annotations) {
		t.Errorf("the first replica's pod changed: labels %v annotations %v, before %v %v", after.Labels, after.Annotations, before.Labels, before.Annotations)
	}
	if _, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, second.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the second replica's pod: %v", err)
	}
	expect("the second replica still the only one active", second.Name)

	// Losing the role, a replica takes the label off its own pod.
	if err := (&ha.Role{Kube: asSecond, Namespace: namespace, Pod: second.Name}).MarkStandby(ctx); err != nil {
		t.Fatalf("the second replica takes the label off its own pod: %v", err)
	}
	expect("no replica active")
	if _, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, bystander.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Error("the bystander pod is gone")
	}
}

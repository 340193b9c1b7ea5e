package reflection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
)

// Reflection reads the ConfigMaps and Secrets of a namespace only where
// the RoleBinding flotilla-reflection lets it: without it, the agent's
// own token is refused them, nothing of them is reflected (the
// namespace's Services are: the witness that the Reflector acted on it)
// and the NamespaceOffload says which binding to make; once it is made,
// they are reflected and the condition clears. The agent never asks for
// a ConfigMap or Secret outside the namespace it reflects.
func TestReflectionNeedsItsRoleBinding(t *testing.T) {
	e := newReflectClients(t)
	e.remote = e.OffloadReady(t, e.ns) // no RoleBinding
	e.recheck = time.Second
	e.start(t, 1)
	ctx := t.Context()
	agent := kubernetes.NewForConfigOrDie(e.agent)

	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Annotations: map[string]string{offload.AnnotationReflect: "true"}},
		StringData: map[string]string{"password": "s3cret"}})
	e.create(t, optIn("cfg", map[string]string{"k": "v"}))
	e.create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api"}, Spec: corev1.ServiceSpec{
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}})
	// A namespace not offloaded, with a Secret that asks to be reflected.
	if err := e.LocalAdmin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.LocalAdmin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Name: "sec",
		Annotations: map[string]string{offload.AnnotationReflect: "true"}}, StringData: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}

	t.Run("without the binding: refused, not reflected, the condition says what to bind", func(t *testing.T) {
		waitRemote(t, e, &corev1.Service{}, "api", func(s *corev1.Service) error { return reflectedFrom(e.ns, "api")(s) })
		e.WaitStatus(t, e.ns, "Reflected False, Forbidden", reflectedCondition(e.Provider.ID, metav1.ConditionFalse, v1alpha1.ReasonForbidden,
			"kubectl -n app create rolebinding flotilla-reflection --clusterrole flotilla-agent-reflection --serviceaccount flotilla-system:flotilla-agent"))
		e.remoteAbsent(t, &corev1.Secret{}, "sec")
		e.remoteAbsent(t, &corev1.ConfigMap{}, "cfg")
		binding, err := offload.ReflectionRoleBinding(e.ns, offload.AgentServiceAccount)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []struct {
			what string
			do   func(context.Context) error
		}{
			{"get Secret app/sec", func(ctx context.Context) error {
				_, err := agent.CoreV1().Secrets(e.ns).Get(ctx, "sec", metav1.GetOptions{})
				return err
			}},
			{"list Secrets in app", func(ctx context.Context) error {
				_, err := agent.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"list ConfigMaps in app", func(ctx context.Context) error {
				_, err := agent.CoreV1().ConfigMaps(e.ns).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"list Secrets in kube-system", func(ctx context.Context) error {
				_, err := agent.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
				return err
			}},
			{"get Secret elsewhere/sec (not offloaded)", func(ctx context.Context) error {
				_, err := agent.CoreV1().Secrets("elsewhere").Get(ctx, "sec", metav1.GetOptions{})
				return err
			}},
			{"list Secrets cluster-wide", func(ctx context.Context) error {
				_, err := agent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
				return err
			}},
			{"list ConfigMaps cluster-wide", func(ctx context.Context) error {
				_, err := agent.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
				return err
			}},
			// It may write RoleBindings (a provider's tenants), but not
			// this one: it holds neither what the role grants nor bind.
			{"create RoleBinding app/flotilla-reflection itself", func(ctx context.Context) error {
				_, err := agent.RbacV1().RoleBindings(e.ns).Create(ctx, binding, metav1.CreateOptions{})
				return err
			}},
		} {
			err := r.do(ctx)
			if !apierrors.IsForbidden(err) {
				t.Errorf("the agent's token may %s: %v, want Forbidden", r.what, err)
				continue
			}
			var status apierrors.APIStatus
			if errors.As(err, &status) {
				t.Logf("refused %s: %d %s", r.what, status.Status().Code, status.Status().Reason)
			}
		}
	})

	t.Run("the binding made: reflected, the condition clears", func(t *testing.T) {
		e.bindReflection(t, e.ns)
		waitRemote(t, e, &corev1.Secret{}, "sec", func(s *corev1.Secret) error {
			if err := reflectedFrom(e.ns, "sec")(s); err != nil {
				return err
			}
			if string(s.Data["password"]) != "s3cret" {
				return fmt.Errorf("data %v", s.Data)
			}
			return nil
		})
		waitRemote(t, e, &corev1.ConfigMap{}, "cfg", configMapData("k", "v"))
		e.WaitStatus(t, e.ns, "Reflected True", reflectedCondition(e.Provider.ID, metav1.ConditionTrue, v1alpha1.ReasonReflected, ""))
		if _, err := agent.CoreV1().Secrets(e.ns).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("the agent's token lists Secrets in app with the binding: %v", err)
		}
		if _, err := agent.CoreV1().Secrets("elsewhere").Get(ctx, "sec", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent's token may read Secret elsewhere/sec: %v, want Forbidden", err)
		}
	})

	// Each change of the NamespaceOffload reconciles the namespace; its
	// rights are asked once per answer's life, not once per change.
	t.Run("a burst of changes costs a round of reviews, not one each", func(t *testing.T) {
		hitsBefore := rightsCache(t, e, "hit")
		seen := len(e.requests.All())
		start := time.Now()
		// Spread over a few seconds, well within an answer's life: each
		// change is reconciled on its own, not merged by the work queue
		// with the next.
		const changes = 20
		for i := range changes {
			time.Sleep(150 * time.Millisecond)
			o := &v1alpha1.NamespaceOffload{}
			if err := e.LocalAdmin.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: "offload"}, o); err != nil {
				t.Fatal(err)
			}
			patch := client.MergeFrom(o.DeepCopy())
			if o.Annotations == nil {
				o.Annotations = map[string]string{}
			}
			o.Annotations["example.com/touched"] = fmt.Sprint(i)
			if err := e.LocalAdmin.Patch(ctx, o, patch); err != nil {
				t.Fatal(err)
			}
		}
		// The witness: the changes were reconciled, their rights
		// answered from the cache.
		eventually.Within(t, 30*time.Second, "answers from the cache", func() error {
			if hits := rightsCache(t, e, "hit") - hitsBefore; hits < 1 {
				return fmt.Errorf("%v hits", hits)
			}
			return nil
		})
		elapsed := time.Since(start)
		var reviews int
		for _, req := range e.requests.All()[seen:] {
			if strings.Contains(req, "selfsubjectaccessreviews") {
				reviews++
			}
		}
		// Four reviews per answer's life, one more round for the one
		// under way when the burst began.
		most := 4 * (2 + int(elapsed/rightsTTL))
		t.Logf("%d changes of the NamespaceOffload in %s: %d reviews asked (at most %d)", changes, elapsed.Round(time.Millisecond), reviews, most)
		if reviews > most {
			t.Errorf("%d reviews for %d changes in %s, want at most %d", reviews, changes, elapsed, most)
		}
	})

	t.Run("the binding removed: the agent stops reading, what was reflected stays", func(t *testing.T) {
		if err := e.Local.Client.RbacV1().RoleBindings(e.ns).Delete(ctx, offload.ReflectionBinding, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.WaitStatus(t, e.ns, "Reflected False, Forbidden again", reflectedCondition(e.Provider.ID, metav1.ConditionFalse, v1alpha1.ReasonForbidden,
			"RoleBinding flotilla-reflection in app must bind ClusterRole flotilla-agent-reflection to ServiceAccount flotilla-system/flotilla-agent"))
		sec, err := e.Local.Client.CoreV1().Secrets(e.ns).Get(ctx, "sec", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sec.Data["password"] = []byte("changed")
		if _, err := e.Local.Client.CoreV1().Secrets(e.ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The witness: a change after it, to the Service, reflected.
		svc, err := e.Local.Client.CoreV1().Services(e.ns).Get(ctx, "api", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Labels = map[string]string{"witness": "1"}
		if _, err := e.Local.Client.CoreV1().Services(e.ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRemote(t, e, &corev1.Service{}, "api", func(s *corev1.Service) error {
			if s.Labels["witness"] != "1" {
				return fmt.Errorf("labels %v", s.Labels)
			}
			return nil
		})
		got := waitRemote(t, e, &corev1.Secret{}, "sec", nil)
		if string(got.Data["password"]) != "s3cret" {
			t.Errorf("Secret sec on the provider: %q, want it as reflected before the binding went", got.Data["password"])
		}
	})

	t.Run("the agent asked for ConfigMaps and Secrets only in the offloaded namespace", func(t *testing.T) {
		var inApp int
		for _, req := range e.requests.All() {
			_, path, _ := strings.Cut(req, " ")
			if !strings.HasSuffix(path, "/secrets") && !strings.HasSuffix(path, "/configmaps") &&
				!strings.Contains(path, "/secrets/") && !strings.Contains(path, "/configmaps/") {
				continue
			}
			if !strings.HasPrefix(path, "/api/v1/namespaces/"+e.ns+"/") {
				t.Errorf("the Reflector asked %s: outside namespace %s", req, e.ns)
				continue
			}
			inApp++
		}
		if inApp == 0 {
			t.Errorf("the Reflector never read the ConfigMaps and Secrets of %s, which it reflected: requests %v", e.ns, e.requests.All())
		}
	})
}

// rightsCache is flotilla_reflection_rights_cache_total{result}.
func rightsCache(t *testing.T, e *reflectEnv, result string) float64 {
	t.Helper()
	families, err := e.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "flotilla_reflection_rights_cache_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

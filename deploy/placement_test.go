package deploy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/placement"
	"github.com/flotilla-io/flotilla/test/harness"
)

// TestPlacement applies deploy/ to a real control plane and runs what
// placement does (docs/offload.md) with the agent's own token: the
// webhook, its CA Secret and configuration are allowed; the nearest things
// beside them are not. The label on offloaded namespaces is the
// administrator's (TestGrants' red team).
func TestPlacement(t *testing.T) {
	cp := installDeploy(t)
	agent := kubernetes.NewForConfigOrDie(agentConfig(t, cp))
	waitAgentFencesEnforced(t, cp, agent)

	t.Run("the webhook runs with the agent's rights", func(t *testing.T) { testPlacementWebhookAsAgent(t, cp, agent) })
	t.Run("the agent is refused other webhooks and Secrets", func(t *testing.T) { testPlacementRefusals(t, agent) })
	t.Run("the kubelet API keeps its CA with the agent's rights", func(t *testing.T) { testKubeletCAAsAgent(t, cp, agent) })
}

// lockedBuffer is the webhook's log, written from its goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The webhook, run with the agent's token, makes its CA Secret and its
// configuration, and the API server calls it: a pod of a Remote
// namespace without a provider is refused with its message, which it
// could not write without reading the NamespaceOffload. Its cleanup
// deletes the configuration.
func testPlacementWebhookAsAgent(t *testing.T, cp *harness.ControlPlane, agent kubernetes.Interface) {
	ctx := t.Context()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	var logs lockedBuffer
	w, err := placement.NewWebhook(placement.WebhookConfig{
		Config: agentConfig(t, cp), Address: netip.MustParseAddr("127.0.0.1"), Port: port, AgentNamespace: namespace,
		// As the agent runs it by default: only the API server's client
		// certificate, checked against the cluster's client CA, which
		// the agent's own rights read.
		ClientNames: placement.DefaultClientNames,
		Logger:      slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testLog{t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("the webhook, run as the agent: %v", err)
			}
		}
	}
	defer stop()

	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "shop", Labels: map[string]string{offload.LabelOffloaded: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "NamespaceOffload",
		"metadata": map[string]any{"name": "offload"},
		"spec":     map[string]any{"podOffloading": string(v1alpha1.PodsRemote)},
	}}
	offloads := dynamic.NewForConfigOrDie(cp.Config).Resource(v1alpha1.GroupVersion.WithResource("namespaceoffloads")).Namespace("shop")
	if _, err := offloads.Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 60*time.Second, "a pod of shop refused by the webhook", func() error {
		_, err := cp.Client.CoreV1().Pods("shop").Create(ctx, pod("early"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), "no provider yet") {
			return fmt.Errorf("created: %v", err)
		}
		return nil
	})
	if _, err := cp.Client.CoreV1().Secrets(namespace).Get(ctx, placement.CASecret, metav1.GetOptions{}); err != nil {
		t.Errorf("the CA Secret: %v", err)
	}
	stop()
	if strings.Contains(strings.ToLower(logs.String()), "forbidden") {
		t.Errorf("the webhook was refused something:\n%s", logs.String())
	}
	if err := placement.DeleteConfiguration(ctx, agent); err != nil {
		t.Errorf("the agent deletes its webhook configuration: %v", err)
	}
}

// testLog passes log lines to the test's log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Beside what placement needs: another webhook configuration, another
// Secret in the agent's namespace, reading one.
func testPlacementRefusals(t *testing.T, agent kubernetes.Interface) {
	apply := func(obj string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := agent.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, obj, types.ApplyPatchType,
				fmt.Appendf(nil, `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration","metadata":{"name":%q}}`, obj),
				metav1.PatchOptions{FieldManager: "flotilla-placement"})
			return err
		}
	}
	for _, r := range []refusal{
		{"apply another mutating webhook configuration", "", apply("escape")},
		{"delete another mutating webhook configuration", "", func(ctx context.Context) error {
			return agent.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, "someone-elses", metav1.DeleteOptions{})
		}},
		{"list mutating webhook configurations", "", func(ctx context.Context) error {
			_, err := agent.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create a validating webhook configuration", "", func(ctx context.Context) error {
			_, err := agent.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
				&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: placement.ConfigurationName}}, metav1.CreateOptions{})
			return err
		}},
		{"create another Secret in its namespace", "only in tenant namespaces", func(ctx context.Context) error {
			_, err := agent.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "stash"}}, metav1.CreateOptions{})
			return err
		}},
		{"make a Secret of the CA's name elsewhere", "only in tenant namespaces", func(ctx context.Context) error {
			_, err := agent.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: placement.CASecret}}, metav1.CreateOptions{})
			return err
		}},
	} {
		t.Run(r.what, func(t *testing.T) { r.check(t, "the agent") })
	}
	// The agent reads every Secret (reflection, docs/services.md); it may
	// write none outside its own and its tenants' (above).
}

package placement

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	admissionregistrationv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/metadata"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
)

// The placement webhook's objects, by name; deploy/rbac.yaml grants the
// agent these names only.
const (
	// ConfigurationName is the MutatingWebhookConfiguration.
	ConfigurationName = "flotilla-placement"
	// WebhookName is its one webhook's name: API servers quote
	// it in a refusal ("admission webhook ... denied the request").
	WebhookName = "placement.flotilla.io"
	// CASecret holds the webhook's CAs, in the agent's
	// namespace.
	CASecret = "flotilla-placement-ca"
	// DefaultPort is where the agent serves the webhook.
	DefaultPort = 9443
	// placementPath is the webhook's path on that port.
	placementPath = "/placement"
	// placementFieldOwner applies both objects (server-side apply).
	placementFieldOwner = "flotilla-placement"
	// placementTimeout is the API server's wait for an answer: placement
	// answers from memory in well under a millisecond, so a slow answer
	// means a stuck agent, and pod creation should fail fast with it.
	placementTimeout = 5
)

// offloadCRD owns the configuration: deleting the CRD (uninstalling with
// `kubectl delete -k deploy/`) makes the garbage collector delete the
// configuration too, so that no webhook of a removed agent keeps pods
// from being created.
const offloadCRD = "namespaceoffloads.flotilla.io"

// systemNamespaces are never sent to the webhook, whatever their labels:
// with failurePolicy Fail a stopped agent would otherwise block the pods
// that bring the cluster, or the agent itself, back.
var systemNamespaces = []string{metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease}

// Configuration is the MutatingWebhookConfiguration as the agent applies
// it: pods created in namespaces labelled offloaded go to url, trusted by
// bundle; owner, when set, is the CRD's UID. The policy
// flotilla-agent-placement-webhook (deploy/admission-agent.yaml) refuses
// the agent any other rule or namespace selector.
func Configuration(url string, bundle []byte, agentNamespace string, owner types.UID) *admissionregistrationv1ac.MutatingWebhookConfigurationApplyConfiguration {
	excluded := append(append([]string{}, systemNamespaces...), agentNamespace)
	cfg := admissionregistrationv1ac.MutatingWebhookConfiguration(ConfigurationName).
		WithLabels(map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, "app.kubernetes.io/name": "flotilla"}).
		WithWebhooks(admissionregistrationv1ac.MutatingWebhook().
			WithName(WebhookName).
			WithClientConfig(admissionregistrationv1ac.WebhookClientConfig().WithURL(url).WithCABundle(bundle...)).
			WithRules(admissionregistrationv1ac.RuleWithOperations().
				WithOperations(admissionregistrationv1.Create).
				WithAPIGroups("").WithAPIVersions("v1").WithResources("pods").
				WithScope(admissionregistrationv1.NamespacedScope)).
			WithNamespaceSelector(metav1ac.LabelSelector().
				WithMatchLabels(map[string]string{offload.LabelOffloaded: "true"}).
				WithMatchExpressions(metav1ac.LabelSelectorRequirement().
					WithKey(corev1.LabelMetadataName).WithOperator(metav1.LabelSelectorOpNotIn).WithValues(excluded...))).
			// Fail: a pod of a Remote namespace admitted without its
			// placement would run here. Scoped to offloaded namespaces,
			// so a stopped agent blocks pod creation there only.
			WithFailurePolicy(admissionregistrationv1.Fail).
			WithMatchPolicy(admissionregistrationv1.Equivalent).
			WithSideEffects(admissionregistrationv1.SideEffectClassNone).
			WithTimeoutSeconds(placementTimeout).
			WithAdmissionReviewVersions("v1").
			// IfNeeded: a webhook after ours that changes the pod's
			// affinity or tolerations sends it back to us; placement
			// is idempotent, so being asked again costs nothing.
			WithReinvocationPolicy(admissionregistrationv1.IfNeededReinvocationPolicy))
	if owner != "" {
		cfg.WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion("apiextensions.k8s.io/v1").WithKind("CustomResourceDefinition").
			WithName(offloadCRD).WithUID(owner))
	}
	return cfg
}

// ApplyConfiguration writes the configuration (server-side apply: a
// change nobody asked for is put back).
func ApplyConfiguration(ctx context.Context, kube kubeclient.Interface, cfg *admissionregistrationv1ac.MutatingWebhookConfigurationApplyConfiguration) error {
	_, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Apply(ctx, cfg,
		metav1.ApplyOptions{FieldManager: placementFieldOwner, Force: true})
	if err != nil {
		return fmt.Errorf("apply MutatingWebhookConfiguration %s: %w", ConfigurationName, err)
	}
	return nil
}

// offloadCRDUID is the UID of the NamespaceOffload CRD, "" when it is
// not installed.
func offloadCRDUID(ctx context.Context, meta metadata.Interface) (types.UID, error) {
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	m, err := meta.Resource(gvr).Get(ctx, offloadCRD, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read CRD %s: %w", offloadCRD, err)
	}
	return m.UID, nil
}

// DeleteConfiguration removes the placement webhook's configuration,
// for an uninstall: with the agent gone, its failurePolicy Fail would
// refuse every pod created in an offloaded namespace. Deleting the
// NamespaceOffload CRD removes it as well (its owner). Nothing to delete
// is no error.
func DeleteConfiguration(ctx context.Context, kube kubeclient.Interface) error {
	err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, ConfigurationName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete MutatingWebhookConfiguration %s: %w", ConfigurationName, err)
	}
	return nil
}

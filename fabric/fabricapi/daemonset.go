package fabricapi

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// agentContainer is the container of the agent's Deployment whose image
// the fabric runs.
const agentContainer = "agent"

// MetricsPort is where a fabric pod serves /healthz and /metrics on its
// node (host network; the agent's is 9470): health to anyone on the
// loopback and the node's address, the rest to the loopback and to bearer
// tokens the API server says may get the path.
const MetricsPort = 9471

// ApplyDaemonSet applies the fabric's DaemonSet, owned by the agent's
// Deployment (so deleting the agent deletes it) and running the agent's
// own image.
func (p *Publisher) ApplyDaemonSet(ctx context.Context) error {
	owner, err := p.client.AppsV1().Deployments(p.namespace).Get(ctx, p.owner, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the agent's Deployment %s/%s for the fabric's image: %w", p.namespace, p.owner, err)
	}
	ds, err := DaemonSet(owner)
	if err != nil {
		return err
	}
	if _, err := p.client.AppsV1().DaemonSets(p.namespace).Apply(ctx, ds, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return fmt.Errorf("apply DaemonSet %s/%s: %w", p.namespace, DaemonSetName, err)
	}
	return nil
}

// DaemonSet is the fabric's DaemonSet for the agent's Deployment owner: on
// every node (the pod on the gateway node applies the gateway's part), in
// the host network with NET_ADMIN only, with the agent's image, pull
// policy and pull secrets, and the API server address the agent was given.
func DaemonSet(owner *appsv1.Deployment) (*appsv1ac.DaemonSetApplyConfiguration, error) {
	var agent *corev1.Container
	for i, c := range owner.Spec.Template.Spec.Containers {
		if c.Name == agentContainer {
			agent = &owner.Spec.Template.Spec.Containers[i]
		}
	}
	if agent == nil {
		return nil, fmt.Errorf("the agent's Deployment %s/%s has no container named %q", owner.Namespace, owner.Name, agentContainer)
	}
	env := []*corev1ac.EnvVarApplyConfiguration{
		corev1ac.EnvVar().WithName("NODE_NAME").WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("spec.nodeName"))),
		corev1ac.EnvVar().WithName("POD_NAMESPACE").WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("metadata.namespace"))),
		// The node's address (host network): where the probes reach
		// /healthz and /readyz, besides the loopback.
		corev1ac.EnvVar().WithName("POD_IP").WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("status.podIP"))),
	}
	// Where the agent is told the API server's address (no kube-proxy
	// yet on a new cluster), the fabric is told the same.
	for _, e := range agent.Env {
		if e.Name == "KUBERNETES_SERVICE_HOST" || e.Name == "KUBERNETES_SERVICE_PORT" {
			env = append(env, corev1ac.EnvVar().WithName(e.Name).WithValue(e.Value))
		}
	}
	var secrets []*corev1ac.LocalObjectReferenceApplyConfiguration
	for _, s := range owner.Spec.Template.Spec.ImagePullSecrets {
		secrets = append(secrets, corev1ac.LocalObjectReference().WithName(s.Name))
	}
	lbl := labels("fabric")
	container := corev1ac.Container().
		WithName("fabric").
		WithImage(agent.Image).
		WithImagePullPolicy(agent.ImagePullPolicy).
		WithArgs("fabric", "--log-format=json", fmt.Sprintf("--metrics-addr=:%d", MetricsPort)).
		WithEnv(env...).
		// Named for Prometheus (deploy/monitoring/podmonitor.yaml).
		WithPorts(corev1ac.ContainerPort().WithName("metrics").WithContainerPort(MetricsPort).WithProtocol(corev1.ProtocolTCP)).
		WithLivenessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/healthz").WithPort(intstr.FromInt32(MetricsPort))).
			WithPeriodSeconds(10).WithTimeoutSeconds(2).WithFailureThreshold(3)).
		// Ready once the node holds the newest plan it could read.
		WithReadinessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/readyz").WithPort(intstr.FromInt32(MetricsPort))).
			WithPeriodSeconds(2).WithTimeoutSeconds(2).WithFailureThreshold(2)).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("10m"),
				corev1.ResourceMemory: resource.MustParse("24Mi"),
			}).
			WithLimits(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("96Mi")})).
		WithSecurityContext(corev1ac.SecurityContext().
			WithPrivileged(false).
			WithAllowPrivilegeEscalation(false).
			WithReadOnlyRootFilesystem(true).
			WithRunAsUser(0).WithRunAsNonRoot(false).
			// NET_ADMIN: routes, rules and nftables of the node.
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL").WithAdd("NET_ADMIN")).
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault)))
	pod := corev1ac.PodSpec().
		WithServiceAccountName(ServiceAccountName).
		WithHostNetwork(true).
		WithDNSPolicy(corev1.DNSClusterFirstWithHostNet).
		WithImagePullSecrets(secrets...).
		// Every node, whatever its taints: a node without the fabric
		// cannot reach the peers.
		WithTolerations(corev1ac.Toleration().WithOperator(corev1.TolerationOpExists)).
		// But no virtual node: it stands for another cluster, which has
		// its own fabric.
		WithAffinity(corev1ac.Affinity().WithNodeAffinity(corev1ac.NodeAffinity().
			WithRequiredDuringSchedulingIgnoredDuringExecution(corev1ac.NodeSelector().WithNodeSelectorTerms(
				corev1ac.NodeSelectorTerm().WithMatchExpressions(corev1ac.NodeSelectorRequirement().
					WithKey(v1alpha1.LabelVirtualNode).WithOperator(corev1.NodeSelectorOpDoesNotExist)))))).
		WithTerminationGracePeriodSeconds(10).
		WithContainers(container)
	return appsv1ac.DaemonSet(DaemonSetName, owner.Namespace).
		WithLabels(lbl).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion("apps/v1").WithKind("Deployment").
			WithName(owner.Name).WithUID(owner.UID)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{
				"app.kubernetes.io/name":      lbl["app.kubernetes.io/name"],
				"app.kubernetes.io/component": lbl["app.kubernetes.io/component"],
			})).
			WithUpdateStrategy(appsv1ac.DaemonSetUpdateStrategy().WithType(appsv1.RollingUpdateDaemonSetStrategyType)).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(lbl).WithSpec(pod))), nil
}

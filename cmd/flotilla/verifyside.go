package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	aboutv1alpha1 "github.com/flotilla-io/flotilla/api/about/v1alpha1"
	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/offload"
)

// The label verify puts on what it creates, beside managed-by=flotilla:
// a namespace left by an interrupted run is found by it.
const (
	labelVerify      = "flotilla.io/verify"
	verifyNamePrefix = "verify-flotilla-"
)

// verifySide is one cluster of a verify run, reached with the user's own
// credentials.
type verifySide struct {
	// name is the context as given (or the kubeconfig).
	name string
	id   string
	// image runs the verify pods: the agent's, or --image.
	image string
	core  corev1client.CoreV1Interface
	c     client.WithWatch
}

func openVerifySide(ctx context.Context, ref clusterRef, agentNS, image string) (*verifySide, error) {
	cfg, name, err := ref.restConfig()
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = ref.name()
	}
	s := &verifySide{name: name, image: image}
	if s.core, err = corev1client.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, v1alpha1.AddToScheme, aboutv1alpha1.AddToScheme, mcsv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	if s.c, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var id aboutv1alpha1.ClusterProperty
	if err := s.c.Get(ctx, client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, &id); err != nil {
		return nil, fmt.Errorf("%s: read ClusterProperty %s, the cluster's ID: %w (is Flotilla installed there? `flotilla info`)", name, aboutv1alpha1.ClusterIDProperty, err)
	}
	s.id = id.Spec.Value
	if s.image == "" {
		var d appsv1.Deployment
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: agentNS, Name: agentDeployment}, &d); err != nil {
			return nil, fmt.Errorf("%s: read the agent's Deployment for its image: %w (or name the image with --image)", name, err)
		}
		s.image = d.Spec.Template.Spec.Containers[0].Image
	}
	return s, nil
}

// peerOf reads this side's Peer for other.
func (s *verifySide) peerOf(ctx context.Context, other *verifySide) (v1alpha1.Peer, error) {
	var p v1alpha1.Peer
	if err := s.c.Get(ctx, client.ObjectKey{Name: other.id}, &p); err != nil {
		if apierrors.IsNotFound(err) {
			return p, fmt.Errorf("%s has no Peer for %s (%s): the clusters are not federated (`flotilla join`)", s.name, other.name, other.id)
		}
		return p, fmt.Errorf("%s: read Peer %s: %w", s.name, other.id, err)
	}
	return p, nil
}

// createNamespace creates the run's namespace, labelled as flotilla's
// own.
func (s *verifySide) createNamespace(ctx context.Context, ns string) error {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, labelVerify: "true",
	}}}
	if err := s.c.Create(ctx, n); err != nil {
		return fmt.Errorf("%s: create namespace %s: %w (verify needs to create a namespace, and pods, Services and ServiceExports in it)", s.name, ns, err)
	}
	return nil
}

// deleteNamespace deletes the run's namespace, if it is verify's, and
// waits until it is gone or ctx ends.
func (s *verifySide) deleteNamespace(ctx context.Context, ns string) error {
	var n corev1.Namespace
	switch err := s.c.Get(ctx, client.ObjectKey{Name: ns}, &n); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("%s: read namespace %s: %w", s.name, ns, err)
	case n.Labels[labelVerify] != "true":
		return fmt.Errorf("%s: namespace %s is not verify's: left alone", s.name, ns)
	}
	if err := s.c.Delete(ctx, &n, client.Preconditions{UID: &n.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: delete namespace %s: %w", s.name, ns, err)
	}
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		err := s.c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return fmt.Errorf("%s: namespace %s still terminating (it goes on its own; `kubectl get namespace %s`)", s.name, ns, ns)
	}
	return nil
}

// verifyPodSpec is a restricted pod of the agent's image running
// `flotilla verify-pod args...`.
func verifyPodSpec(image string, args ...string) corev1.PodSpec {
	no, yes, uid := false, true, int64(65534)
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: new(int64),
		AutomountServiceAccountToken:  &no,
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot: &yes, RunAsUser: &uid,
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name: "verify", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Args: append([]string{"verify-pod"}, args...),
			SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			},
		}},
	}
}

// localOnly keeps a pod off the virtual nodes.
func localOnly(spec *corev1.PodSpec) {
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: offload.LabelClusterID, Operator: corev1.NodeSelectorOpDoesNotExist}},
		}}},
	}}
}

// createServer creates a server pod labelled app=name; provider, when
// set, places it on that provider's virtual node.
func (s *verifySide) createServer(ctx context.Context, ns, name, provider string) error {
	spec := verifyPodSpec(s.image, "serve")
	spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: verifyPort}}
	spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(verifyPort)}},
		PeriodSeconds: 1,
	}
	if provider == "" {
		localOnly(&spec)
	} else {
		spec.NodeSelector = map[string]string{offload.LabelClusterID: provider}
	}
	return s.createPod(ctx, ns, name, spec)
}

// createProbe creates a pod that probes targets for within, then exits.
func (s *verifySide) createProbe(ctx context.Context, ns, name string, within time.Duration, targets []probeTarget) error {
	args := []string{"probe", "--for", within.String()}
	for _, t := range targets {
		args = append(args, t.String())
	}
	spec := verifyPodSpec(s.image, args...)
	spec.RestartPolicy = corev1.RestartPolicyNever
	localOnly(&spec)
	return s.createPod(ctx, ns, name, spec)
}

func (s *verifySide) createPod(ctx context.Context, ns, name string, spec corev1.PodSpec) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name, labelVerify: "true"}}, Spec: spec}
	if err := s.c.Create(ctx, p); err != nil {
		return fmt.Errorf("%s: create pod %s/%s: %w", s.name, ns, name, err)
	}
	return nil
}

// exportServer puts Service name in front of the server pod name and
// exports it (MCS ServiceExport).
func (s *verifySide) exportServer(ctx context.Context, ns, name string) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{labelVerify: "true"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: verifyPort, TargetPort: intstr.FromInt32(verifyPort)}},
		},
	}
	if err := s.c.Create(ctx, svc); err != nil {
		return fmt.Errorf("%s: create Service %s/%s: %w", s.name, ns, name, err)
	}
	exp := &mcsv1alpha1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if err := s.c.Create(ctx, exp); err != nil {
		return fmt.Errorf("%s: create ServiceExport %s/%s: %w", s.name, ns, name, err)
	}
	return nil
}

// waitPod waits until pod name is Ready (done: Succeeded or Failed)
// and returns it; the error says what it was last.
func (s *verifySide) waitPod(ctx context.Context, ns, name string, done bool) (corev1.Pod, error) {
	var p corev1.Pod
	why := fmt.Errorf("no pod %s yet", name)
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			if ctx.Err() == nil {
				why = err
			}
			return false, nil
		}
		if done {
			why = fmt.Errorf("pod %s is %s", name, p.Status.Phase)
			return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
		}
		why = whyNotReady(p)
		return why == nil, nil
	})
	if err != nil {
		return p, fmt.Errorf("%s: not within --wait: %v%s", s.name, why, onNode(p))
	}
	return p, nil
}

func onNode(p corev1.Pod) string {
	if p.Spec.NodeName == "" {
		return " (not scheduled: `kubectl describe pod` says why)"
	}
	return " on node " + p.Spec.NodeName
}

// logs reads pod name's log.
func (s *verifySide) logs(ctx context.Context, ns, name string) (string, error) {
	b, err := s.core.Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: logs of pod %s/%s: %w", s.name, ns, name, err)
	}
	return string(b), nil
}

// offloadTo offloads ns to the providers this cluster holds a grant of
// and waits until provider has its namespace: another provider's
// trouble is not this run's.
func (s *verifySide) offloadTo(ctx context.Context, ns, provider string) error {
	spec := v1alpha1.NamespaceOffloadSpec{
		ClusterSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}},
		NamespaceMapping: v1alpha1.MappingDefaultName, PodOffloading: v1alpha1.PodsLocalAndRemote,
	}
	if _, _, err := writeOffload(ctx, s.c, ns, spec); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if _, err := labelOffloaded(ctx, s.c, ns, true); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	why := "the agent has not acted on the NamespaceOffload (is it running?)"
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		var o v1alpha1.NamespaceOffload
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: offloadName}, &o); err != nil {
			why = err.Error()
			return false, nil
		}
		for _, c := range o.Status.Clusters {
			if c.ClusterID != provider {
				continue
			}
			r := meta.FindStatusCondition(c.Conditions, offload.ConditionReady)
			if r != nil && r.Status == metav1.ConditionTrue {
				return true, nil
			}
			if r != nil {
				why = fmt.Sprintf("%s: %s", r.Reason, r.Message)
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("%s: namespace %s not offloaded to %s in time: %s", s.name, ns, provider, why)
	}
	return nil
}

// grantFrom says whether this side holds a working credential of
// provider's grant, and if not, why.
func grantFrom(p v1alpha1.Peer) (bool, string) {
	for _, c := range p.Status.Conditions {
		if c.Type != v1alpha1.ConditionOffloadCredential {
			continue
		}
		if c.Status == metav1.ConditionTrue {
			return true, ""
		}
		return false, strings.TrimSuffix(c.Reason+": "+c.Message, ": ")
	}
	return false, "no " + v1alpha1.ConditionOffloadCredential + " condition"
}

// viewOf is ip, an address of the peer's, as the Peer's cluster sees
// it (status.theirNetworks).
func viewOf(p v1alpha1.Peer, ip string) (netip.Addr, error) {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("pod address %q: %w", ip, err)
	}
	for _, v := range p.Status.TheirNetworks {
		real, err1 := netip.ParsePrefix(v.Range)
		as, err2 := netip.ParsePrefix(v.As)
		if err := errors.Join(err1, err2); err != nil || !addr.Is4() || real.Bits() != as.Bits() {
			continue
		}
		if real.Contains(addr) {
			return translate(addr, real, as), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("Peer %s has no view of %s (its networks: %s): the peering is not complete (`flotilla peer show %s`)", peerName(p), ip, views(p.Status.TheirNetworks), p.Name)
}

// translate maps ip from range real to the same offset in as.
func translate(ip netip.Addr, real, as netip.Prefix) netip.Addr {
	a, r, i := as.Masked().Addr().As4(), real.Masked().Addr().As4(), ip.As4()
	var out [4]byte
	for k := range out {
		host := i[k] - r[k] // the offset: zero in the network's bits
		out[k] = a[k] | host
	}
	return netip.AddrFrom4(out)
}

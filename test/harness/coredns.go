package harness

import (
	"context"
	_ "embed"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/flotilla-io/flotilla/internal/ociimage"
)

//go:embed coredns-version
var coreDNSVersionFile string

// CoreDNSVersion is the pinned CoreDNS release every cluster of real nodes
// runs. The build script (hack/build-coredns.sh) reads the same file.
var CoreDNSVersion = strings.TrimSpace(coreDNSVersionFile)

// CoreDNSImage is the cluster DNS's image, imported into every real node.
var CoreDNSImage = "flotilla.local/coredns:" + CoreDNSVersion

// The cluster DNS as kubeadm installs it: a Deployment and the kube-dns
// Service in kube-system, its configuration in the ConfigMap coredns.
const (
	DNSNamespace = "kube-system"
	// DNSConfigMap holds the Corefile (key "Corefile").
	DNSConfigMap = "coredns"
	// DNSDeployment runs CoreDNS.
	DNSDeployment = "coredns"
	// DNSService is the cluster DNS's Service, at DNSAddr.
	DNSService = "kube-dns"
	// ClusterDomain is the kubelets' cluster domain.
	ClusterDomain = "cluster.local"
	// dnsReadyPort is where CoreDNS's ready plugin answers.
	dnsReadyPort = 8181
)

// CoreDNSBinary is CoreDNS of CoreDNSVersion as hack/build-coredns.sh
// builds it into the cache.
func CoreDNSBinary() string { return cachedBinary("coredns", CoreDNSVersion, "coredns") }

// CoreDNS is the cluster DNS binary every cluster of real nodes runs.
var CoreDNS = cachedRequirement("CoreDNS "+CoreDNSVersion, CoreDNSBinary, "make coredns")

// cachedBinary is where a hack/build-*.sh script builds a component's
// binary of a version into the cache.
func cachedBinary(component, version, binary string) string {
	return filepath.Join(CacheDir(), component, version, "bin", binary)
}

// cachedRequirement is a binary built into the cache, met once it is
// there; fix is the make target that builds it.
func cachedRequirement(name string, binary func() string, fix string) Requirement {
	return Requirement{
		Name: name,
		Check: func() error {
			_, err := os.Stat(binary())
			return err
		},
		Fix: fix,
	}
}

// DNSAddr is the kube-dns Service's ClusterIP: the 10th address of the
// service range, as kubeadm picks it. Every real node's kubelet has it as
// clusterDNS.
func (cp *ControlPlane) DNSAddr() netip.Addr {
	a := cp.Options.ServiceCIDR.Addr()
	for range 10 {
		a = a.Next()
	}
	return a
}

// Corefile is the cluster DNS's configuration as the harness installs it:
// cluster.local and the reverse zones from the API server, answers cached,
// the file reloaded when the ConfigMap changes. Nothing is forwarded: the
// test machine reaches no resolver outside, so other names fail at once.
func Corefile() string {
	return `.:53 {
    errors
    ready :` + strconv.Itoa(dnsReadyPort) + `
    kubernetes ` + ClusterDomain + ` in-addr.arpa ip6.arpa {
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
    reload 2s
    loadbalance
}
`
}

var coreDNSImage struct {
	once sync.Once
	path string
	err  error
}

// coreDNSImageTarball packages the cached CoreDNS binary as CoreDNSImage,
// once per test binary.
func coreDNSImageTarball() (string, error) {
	b := &coreDNSImage
	b.once.Do(func() {
		if _, err := os.Stat(CoreDNSBinary()); err != nil {
			b.err = fmt.Errorf("CoreDNS %s not built (make coredns): %w", CoreDNSVersion, err)
			return
		}
		img, err := ociimage.Build(ociimage.Spec{
			Binary: CoreDNSBinary(), Path: "/coredns",
			Cmd: []string{"-conf", "/etc/coredns/Corefile"},
		})
		if err != nil {
			b.err = fmt.Errorf("image %s: %w", CoreDNSImage, err)
			return
		}
		dir := filepath.Join(CacheDir(), "images")
		if b.err = os.MkdirAll(dir, 0o755); b.err != nil {
			return
		}
		// Named after the test process, like the other images: Sweep
		// removes those of processes that are gone.
		b.path = filepath.Join(dir, fmt.Sprintf("coredns-%d.tar", os.Getpid()))
		b.err = ociimage.Write(b.path, CoreDNSImage, img)
	})
	return b.path, b.err
}

// installDNS installs the cluster DNS once per control plane, before its
// first node: CoreDNS's account and rights, the Corefile, the Deployment
// and the kube-dns Service at DNSAddr.
func (cp *ControlPlane) installDNS() error {
	cp.dnsOnce.Do(func() { cp.dnsErr = cp.createDNSObjects(context.Background()) })
	return cp.dnsErr
}

func (cp *ControlPlane) createDNSObjects(ctx context.Context) error {
	labels := map[string]string{"k8s-app": "kube-dns"}
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: DNSNamespace, Labels: labels}
	}
	replicas := int32(1)
	c := cp.Client
	creates := []struct {
		what   string
		create func() error
	}{
		{"ServiceAccount coredns", func() error {
			_, err := c.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta("coredns")}, metav1.CreateOptions{})
			return err
		}},
		{"ClusterRole system:coredns", func() error {
			_, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns", Labels: labels},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"services", "namespaces"}, Verbs: []string{"list", "watch"}},
					{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
				},
			}, metav1.CreateOptions{})
			return err
		}},
		{"ClusterRoleBinding system:coredns", func() error {
			_, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns", Labels: labels},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "coredns", Namespace: DNSNamespace}},
			}, metav1.CreateOptions{})
			return err
		}},
		{"ConfigMap " + DNSConfigMap, func() error {
			_, err := c.CoreV1().ConfigMaps(DNSNamespace).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: meta(DNSConfigMap), Data: map[string]string{"Corefile": Corefile()},
			}, metav1.CreateOptions{})
			return err
		}},
		{"Deployment " + DNSDeployment, func() error {
			_, err := c.AppsV1().Deployments(DNSNamespace).Create(ctx, &appsv1.Deployment{
				ObjectMeta: meta(DNSDeployment),
				Spec: appsv1.DeploymentSpec{
					Replicas: &replicas,
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					// Port 53 of the node: a new pod starts once the old
					// one has gone.
					Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec:       cp.dnsPodSpec(),
					},
				},
			}, metav1.CreateOptions{})
			return err
		}},
		{"Service " + DNSService, func() error {
			_, err := c.CoreV1().Services(DNSNamespace).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: DNSService, Namespace: DNSNamespace,
					Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
				Spec: corev1.ServiceSpec{
					ClusterIP: cp.DNSAddr().String(),
					Selector:  labels,
					Ports: []corev1.ServicePort{
						{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
						{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
					},
				},
			}, metav1.CreateOptions{})
			return err
		}},
	}
	for _, o := range creates {
		if err := o.create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("cluster DNS: create %s: %w", o.what, err)
		}
	}
	return nil
}

// dnsPodSpec is CoreDNS's pod. It runs on the node's network: the harness's
// API server listens on loopback, which it relays into every node's
// namespace, and in-cluster configuration reads the address from
// KUBERNETES_SERVICE_HOST and _PORT, as the agent's pod does. The kube-dns
// Service reaches it at the node's address like any endpoint.
func (cp *ControlPlane) dnsPodSpec() corev1.PodSpec {
	return corev1.PodSpec{
		ServiceAccountName:            "coredns",
		HostNetwork:                   true,
		DNSPolicy:                     corev1.DNSDefault,
		PriorityClassName:             "system-cluster-critical",
		TerminationGracePeriodSeconds: new(int64),
		Containers: []corev1.Container{{
			Name: "coredns", Image: CoreDNSImage, ImagePullPolicy: corev1.PullNever,
			Args: []string{"-conf", "/etc/coredns/Corefile"},
			Env: []corev1.EnvVar{
				{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"},
				{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(int(cp.Addr.Port()))},
			},
			Ports: []corev1.ContainerPort{
				{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
			},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(dnsReadyPort)}},
				PeriodSeconds: 1,
			},
			VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
		}},
		Volumes: []corev1.Volume{{
			Name: "config",
			VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: DNSConfigMap},
				Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}},
			}},
		}},
	}
}

// WaitDNS waits until the cluster DNS has a Ready pod behind the kube-dns
// Service and returns that pod.
func (cp *ControlPlane) WaitDNS(t TB) corev1.Pod {
	t.Helper()
	var ready corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%d pods", len(pods.Items))
		for _, p := range pods.Items {
			last += fmt.Sprintf("; %s on %q: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready = p
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("cluster DNS of %s not Ready within 90s: %s", cp.Name, last)
	}
	return ready
}

// stopDNS scales the cluster DNS to none, so that draining the nodes does
// not make the Deployment put its pod back on another one.
func (cp *ControlPlane) stopDNS(ctx context.Context) {
	patch := []byte(`{"spec":{"replicas":0}}`)
	cp.Client.AppsV1().Deployments(DNSNamespace).Patch(ctx, DNSDeployment, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/internal/eventually"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/mcs"
	"github.com/flotilla-io/flotilla/test/federation"
	"github.com/flotilla-io/flotilla/test/harness"
)

// Services across three clusters of real nodes (docs/services.md). a
// offloads namespace shop to b: an offloaded pod's ConfigMap and Secret
// follow it there, a foreign object of the same name on b is left alone,
// and the pod reaches a pod at home through the reflected Service's
// ClusterIP (b's kube-proxy, then the tunnel). Then the Multi-Cluster
// Services API by namespace sameness: b exports echo, a imports it with
// b's endpoints in a's view of b, a's pod resolves the clusterset name
// through a's agent and reaches b's pod; c's export of a different shape
// conflicts and loses to b's older one; unexporting removes the imports.
// Last, `flotilla verify` from a to b passes, and fails with b's agent
// down; `flotilla gather`'s bundles of a and b hold none of their
// credentials.
func TestServicesAcrossClusters(t *testing.T) {
	longRunning(t)
	harness.Require(t, harness.NeedsNodes...)
	env := harness.New(t)
	cs := federation.OnNodes(t, env, federation.NodeOptions{
		Clusters: 3, PodCIDR: netip.MustParsePrefix("10.0.0.0/16"),
		ArgsFor: func(i int) []string {
			if i > 0 {
				return []string{"--offload-grants=auto", "--cluster-label=region=a"}
			}
			return nil
		},
	})
	a, b, c := cs[0], cs[1], cs[2]
	federation.WaitPhases(t, federation.Clusters(cs), v1alpha1.PhaseConnected, 90*time.Second)
	aID, bID, cID := peerID(t, b, a.Name), peerID(t, a, b.Name), peerID(t, a, c.Name)
	for _, p := range []*federation.NodeCluster{b, c} {
		acceptOffloading(t, a, p.Name, "region")
		waitCondition(t, a, p.Name, v1alpha1.ConditionOffloadCredential, "Ready", 60*time.Second)
	}
	waitVirtualNode(t, a, bID, 60*time.Second)
	waitVirtualNode(t, a, cID, 60*time.Second)

	shop, err := offload.RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", aID)
	if err != nil {
		t.Fatal(err)
	}
	createNamespace(t, a, "shop")
	offloadNamespace(t, a, "shop", "--selector", "region=a", "--pods", "LocalAndRemote")
	createObject(t, a, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "shop"}, Data: map[string]string{"greeting": "hello"}})
	createObject(t, a, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "shop"}, StringData: map[string]string{"token": "s3cret"}})
	createObject(t, a, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "unused", Namespace: "shop"}, Data: map[string]string{"x": "y"}})
	// b's own ConfigMap "local" in the mirrored namespace, which a's
	// "local" (opted in) must not overwrite.
	createObject(t, b, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "local", Namespace: shop}, Data: map[string]string{"owner": "b"}})
	createObject(t, a, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "local", Namespace: "shop", Annotations: map[string]string{offload.AnnotationReflect: "true"}},
		Data:       map[string]string{"owner": "a"},
	})

	appSpec := appPod("app", map[string]string{offload.LabelClusterID: bID})
	appSpec.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "settings", MountPath: "/etc/settings"}, {Name: "creds", MountPath: "/etc/creds"}}
	appSpec.Spec.Volumes = []corev1.Volume{
		{Name: "settings", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
		{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
	}
	createObject(t, a, appSpec)
	homePod := appPod("home", map[string]string{"kubernetes.io/hostname": a.Gateway.NodeName})
	createObject(t, a, homePod)
	createObject(t, a, serviceFor("home", "shop"))
	// For the traffic matrices: a home pod behind no Service, and a pod
	// on c behind a Service that goes to b as well.
	createObject(t, a, appPod("secret", map[string]string{"kubernetes.io/hostname": a.Gateway.NodeName}))
	createObject(t, a, appPod("far", map[string]string{offload.LabelClusterID: cID}))
	createObject(t, a, serviceFor("far", "shop"))
	app := waitPods(t, a, "shop", "app=app", 1, 120*time.Second, runningOn(offload.VirtualNodeName(bID)))[0]
	home := waitPods(t, a, "shop", "app=home", 1, 90*time.Second, runningOn(a.Gateway.NodeName))[0]
	secret := waitPods(t, a, "shop", "app=secret", 1, 90*time.Second, runningOn(a.Gateway.NodeName))[0]
	far := waitPods(t, a, "shop", "app=far", 1, 120*time.Second, runningOn(offload.VirtualNodeName(cID)))[0]

	t.Run("the offloaded pod reads its ConfigMap and Secret on b", func(t *testing.T) {
		for file, want := range map[string]string{"/etc/settings/greeting": "hello", "/etc/creds/token": "s3cret"} {
			out, err := federation.Kubectl(a.CP, "-n", "shop", "exec", app.Name, "--", "/testserver", "-cat", file)
			if err != nil || out != want {
				t.Errorf("%s in the offloaded pod: %q (err %v), want %q", file, out, err, want)
			}
		}
		for _, name := range []string{"settings", "creds"} {
			obj := reflectedObject(t, b, shop, name)
			if obj.Labels[offload.LabelReflected] != "true" || !strings.HasPrefix(obj.Annotations[offload.AnnotationOrigin], "shop/"+name+"/") {
				t.Errorf("%s on %s: labels %v, annotations %v, want it marked reflected from a's shop/%s", name, b.Name, obj.Labels, obj.Annotations, name)
			}
		}
	})

	t.Run("an update reaches b; what no pod references does not go", func(t *testing.T) {
		cm, err := a.CP.Client.CoreV1().ConfigMaps("shop").Get(context.Background(), "settings", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["greeting"] = "hi"
		if _, err := a.CP.Client.CoreV1().ConfigMaps("shop").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 30*time.Second, "the update of settings on "+b.Name, func() error {
			got, err := b.CP.Client.CoreV1().ConfigMaps(shop).Get(context.Background(), "settings", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Data["greeting"] != "hi" {
				return fmt.Errorf("settings on %s has greeting=%q, want hi", b.Name, got.Data["greeting"])
			}
			return nil
		})
		// settings (created after unused) arrived: the reflector has seen
		// shop's ConfigMaps, unused among them.
		if _, err := b.CP.Client.CoreV1().ConfigMaps(shop).Get(context.Background(), "unused", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("unused, referenced by no pod, on %s: err %v, want not found", b.Name, err)
		}
	})

	t.Run("a foreign object of the same name is untouched and the condition says so", func(t *testing.T) {
		eventually.Within(t, 30*time.Second, "a Reflected condition naming the foreign ConfigMap local", func() error {
			nso := namespaceOffload(t, a, "shop")
			for _, cl := range nso.Status.Clusters {
				if cl.ClusterID != bID {
					continue
				}
				cond := meta.FindStatusCondition(cl.Conditions, v1alpha1.ConditionReflected)
				if cond == nil || cond.Reason != v1alpha1.ReasonForeignObject || !strings.Contains(cond.Message, "local") {
					return fmt.Errorf("%s's entry: condition %s is %+v, want reason %s naming local", b.Name, v1alpha1.ConditionReflected, cond, v1alpha1.ReasonForeignObject)
				}
				return nil
			}
			return fmt.Errorf("no entry for %s in %+v", b.Name, nso.Status.Clusters)
		})
		got, err := b.CP.Client.CoreV1().ConfigMaps(shop).Get(context.Background(), "local", metav1.GetOptions{})
		if err != nil || got.Data["owner"] != "b" || got.Labels[offload.LabelReflected] != "" {
			t.Errorf("b's own ConfigMap local: %+v (err %v), want it as b wrote it", got, err)
		}
	})

	t.Run("the offloaded pod reaches the home pod through the reflected Service", func(t *testing.T) {
		homeOnB := federation.ViewOf(t, b.Cluster, a.Cluster, netip.MustParseAddr(home.Status.PodIP))
		var svc *corev1.Service
		eventually.Within(t, 60*time.Second, "Service home reflected to "+b.Name+" with home's endpoint in b's view of a", func() error {
			var err error
			if svc, err = b.CP.Client.CoreV1().Services(shop).Get(context.Background(), "home", metav1.GetOptions{}); err != nil {
				return err
			}
			return sliceAddresses(b, shop, "home", homeOnB.String())
		})
		// The caller as a's home pod sees it: a's view of the offloaded
		// pod on b, which is the address a shows for it.
		url := fmt.Sprintf("http://%s:%d/", svc.Spec.ClusterIP, harness.TestServerHTTPPort)
		eventually.Within(t, 30*time.Second, "the offloaded pod's GET "+url, func() error {
			return federation.GetAnswer(a, app, url, netip.MustParseAddr(app.Status.PodIP), a.Name, home)
		})
	})

	for _, cl := range cs {
		createNamespace(t, cl, "mcs")
	}
	// a's pods resolve clusterset.local through a's CoreDNS, which
	// forwards the zone to a's agent as docs/services.md says to.
	a.ForwardClusterset(t)
	echoSpec := appPod("echo", map[string]string{"kubernetes.io/hostname": b.Gateway.NodeName})
	echoSpec.Namespace = "mcs"
	createObject(t, b, echoSpec)
	createObject(t, b, serviceFor("echo", "mcs"))
	echo := waitPods(t, b, "mcs", "app=echo", 1, 90*time.Second, runningOn(b.Gateway.NodeName))[0]
	echoOnA := federation.ViewOf(t, a.Cluster, b.Cluster, netip.MustParseAddr(echo.Status.PodIP))
	exportB := time.Now()
	mustKubectlApply(t, b, exportManifest("echo", "mcs"))

	t.Run("b's export: a imports it with b's endpoint in a's view of b", func(t *testing.T) {
		imp := waitServiceImport(t, a, "mcs", "echo", 60*time.Second, func(si mcsv1alpha1.ServiceImport) error {
			if si.Spec.Type != mcsv1alpha1.ClusterSetIP || len(si.Spec.IPs) != 1 {
				return fmt.Errorf("type %s, ips %v: want ClusterSetIP with one IP", si.Spec.Type, si.Spec.IPs)
			}
			return nil
		})
		if len(imp.Spec.Ports) != 1 || imp.Spec.Ports[0].Port != harness.TestServerHTTPPort {
			t.Errorf("ServiceImport ports %+v, want %d", imp.Spec.Ports, harness.TestServerHTTPPort)
		}
		eventually.Within(t, 30*time.Second, "a's EndpointSlice of echo from b", func() error {
			return mcsSliceAddresses(a, "mcs", "echo", bID, echoOnA.String())
		})
		t.Logf("export in %s to usable import in %s: %s", b.Name, a.Name, time.Since(exportB).Round(time.Millisecond))
	})

	t.Run("a's pod resolves echo.mcs.svc.clusterset.local through a's CoreDNS and agent and reaches b's pod", func(t *testing.T) {
		url := fmt.Sprintf("http://echo.mcs.svc.%s:%d/", strings.TrimSuffix(mcs.Zone, "."), harness.TestServerHTTPPort)
		want := federation.ViewOf(t, b.Cluster, a.Cluster, netip.MustParseAddr(a.Web.Status.PodIP))
		// CoreDNS restarted with the block (ForwardClusterset); the name
		// answers once a's agent has imported b's export.
		eventually.Within(t, 120*time.Second, "a's pod GET "+url+" resolved by a's cluster DNS", func() error {
			return federation.GetAnswer(a, a.Web, url, want, b.Name, echo)
		})
	})

	t.Run("c's export of another shape conflicts and loses to b's older one", func(t *testing.T) {
		svc := serviceFor("echo", "mcs")
		svc.Spec.Ports[0].Port = 9999
		createObject(t, c, svc)
		mustKubectlApply(t, c, exportManifest("echo", "mcs"))
		waitServiceImport(t, a, "mcs", "echo", 60*time.Second, func(si mcsv1alpha1.ServiceImport) error {
			if cond := meta.FindStatusCondition(si.Status.Conditions, mcs.ImportConditionConflict); cond == nil || cond.Status != metav1.ConditionTrue {
				return fmt.Errorf("condition %s is %+v, want True", mcs.ImportConditionConflict, cond)
			}
			if len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != harness.TestServerHTTPPort {
				return fmt.Errorf("ports %+v, want b's (%d): the oldest export wins", si.Spec.Ports, harness.TestServerHTTPPort)
			}
			return nil
		})
		eventually.Within(t, 60*time.Second, "c's ServiceExport says Conflict", func() error {
			var se mcsv1alpha1.ServiceExport
			if err := kubectlJSON(c, &se, "-n", "mcs", "get", "serviceexport", "echo"); err != nil {
				return err
			}
			if cond := meta.FindStatusCondition(se.Status.Conditions, string(mcsv1alpha1.ServiceExportConditionConflict)); cond == nil || cond.Status != metav1.ConditionTrue {
				return fmt.Errorf("c's ServiceExport condition %s is %+v, want True", mcsv1alpha1.ServiceExportConditionConflict, cond)
			}
			return nil
		})
	})

	seeTheFederation(t, cs)

	t.Run("segregated traffic", func(t *testing.T) {
		segregatedMatrices(t, trafficFixture{
			a: a, b: b, c: c, aID: aID, bID: bID, cID: cID, shopOnB: shop,
			app: app, far: far, home: home, secret: secret, echo: echo,
		})
	})

	t.Run("a pod's reference removed: its Secret leaves b", func(t *testing.T) {
		mustKubectl(t, a.CP, "-n", "shop", "delete", "pod", app.Name, "--wait=true")
		waitGone(t, "Secret creds on "+b.Name, func() error {
			_, err := b.CP.Client.CoreV1().Secrets(shop).Get(context.Background(), "creds", metav1.GetOptions{})
			return err
		})
		// The opted-in local is still reflected (well, refused): the
		// Service home still there is the witness that reflection of shop
		// goes on.
		if _, err := b.CP.Client.CoreV1().Services(shop).Get(context.Background(), "home", metav1.GetOptions{}); err != nil {
			t.Errorf("Service home on %s after the pod went: %v, want it kept (the namespace is still offloaded)", b.Name, err)
		}
	})

	t.Run("unexport removes the import everywhere", func(t *testing.T) {
		for _, cl := range []*federation.NodeCluster{b, c} {
			mustKubectl(t, cl.CP, "-n", "mcs", "delete", "serviceexport", "echo")
		}
		for _, cl := range cs {
			waitGone(t, "ServiceImport mcs/echo on "+cl.Name, func() error {
				var si mcsv1alpha1.ServiceImport
				return kubectlJSON(cl, &si, "-n", "mcs", "get", "serviceimport", "echo")
			})
		}
	})

	// a holds a grant from b and forwards clusterset.local: what
	// `flotilla verify` checks is all there.
	testVerify(t, a, b)
	testGather(t, env, a, b, bID)
	testVerifyFails(t, a, b)
}

// appPod is a pod of the test server labelled app=name, on the nodes
// nodeSelector picks.
func appPod(name string, nodeSelector map[string]string) *corev1.Pod {
	p := testPod(name, nodeSelector)
	p.Namespace = "shop"
	return p
}

// serviceFor is a ClusterIP Service of the test server's HTTP port
// selecting app=name.
func serviceFor(name, ns string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: harness.TestServerHTTPPort,
				TargetPort: intstr.FromInt32(harness.TestServerHTTPPort),
			}},
		},
	}
}

// createObject creates a Pod, ConfigMap, Secret or Service on c.
func createObject(t *testing.T, c *federation.NodeCluster, obj any) {
	t.Helper()
	ctx, api := context.Background(), c.CP.Client.CoreV1()
	var err error
	var what string
	switch o := obj.(type) {
	case *corev1.Pod:
		what = "Pod " + o.Namespace + "/" + o.Name
		_, err = api.Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.ConfigMap:
		what = "ConfigMap " + o.Namespace + "/" + o.Name
		_, err = api.ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Secret:
		what = "Secret " + o.Namespace + "/" + o.Name
		_, err = api.Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Service:
		what = "Service " + o.Namespace + "/" + o.Name
		_, err = api.Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	default:
		t.Fatalf("createObject: %T", obj)
	}
	if err != nil {
		t.Fatalf("create %s on %s: %v", what, c.Name, err)
	}
}

// reflectedObject waits for the ConfigMap or Secret name in ns on c and
// returns its metadata.
func reflectedObject(t *testing.T, c *federation.NodeCluster, ns, name string) metav1.ObjectMeta {
	t.Helper()
	var m metav1.ObjectMeta
	eventually.Within(t, 30*time.Second, name+" in "+ns+" on "+c.Name, func() error {
		if cm, err := c.CP.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{}); err == nil {
			m = cm.ObjectMeta
			return nil
		}
		s, err := c.CP.Client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		m = s.ObjectMeta
		return nil
	})
	return m
}

// sliceAddresses says why the EndpointSlices of Service svc in ns on c do
// not list exactly want.
func sliceAddresses(c *federation.NodeCluster, ns, svc string, want ...string) error {
	return slicesListing(c, ns, discoveryv1.LabelServiceName+"="+svc, want)
}

// mcsSliceAddresses is sliceAddresses for the slices imported for svc
// from source.
func mcsSliceAddresses(c *federation.NodeCluster, ns, svc, source string, want ...string) error {
	return slicesListing(c, ns, mcs.LabelServiceName+"="+svc+","+mcs.LabelSourceCluster+"="+source, want)
}

func slicesListing(c *federation.NodeCluster, ns, selector string, want []string) error {
	list, err := c.CP.Client.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err
	}
	var got []string
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			got = append(got, e.Addresses...)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		return fmt.Errorf("EndpointSlices %s in %s on %s list %v, want %v", selector, ns, c.Name, got, want)
	}
	return nil
}

// waitGone waits until get returns NotFound.
func waitGone(t *testing.T, what string, get func() error) {
	t.Helper()
	eventually.Within(t, 60*time.Second, what+" gone", func() error {
		if err := get(); apierrors.IsNotFound(err) || (err != nil && strings.Contains(err.Error(), "NotFound")) {
			return nil
		} else if err != nil {
			return err
		}
		return fmt.Errorf("%s still there", what)
	})
}

// namespaceOffload reads the NamespaceOffload of ns on c.
func namespaceOffload(t *testing.T, c *federation.NodeCluster, ns string) v1alpha1.NamespaceOffload {
	t.Helper()
	var nso v1alpha1.NamespaceOffload
	if err := kubectlJSON(c, &nso, "-n", ns, "get", "namespaceoffload", "offload"); err != nil {
		t.Fatal(err)
	}
	return nso
}

// kubectlJSON gets an object with kubectl -o json into out; a missing
// object is an error that contains NotFound.
func kubectlJSON(c *federation.NodeCluster, out any, args ...string) error {
	s, err := federation.Kubectl(c.CP, append(args, "-o", "json")...)
	if err != nil {
		return fmt.Errorf("kubectl %s on %s: %v: %s", strings.Join(args, " "), c.Name, err, s)
	}
	return json.Unmarshal([]byte(s), out)
}

// waitServiceImport waits until c has ServiceImport ns/name passing check.
func waitServiceImport(t *testing.T, c *federation.NodeCluster, ns, name string, timeout time.Duration, check func(mcsv1alpha1.ServiceImport) error) mcsv1alpha1.ServiceImport {
	t.Helper()
	var si mcsv1alpha1.ServiceImport
	eventually.Within(t, timeout, "ServiceImport "+ns+"/"+name+" on "+c.Name, func() error {
		si = mcsv1alpha1.ServiceImport{}
		if err := kubectlJSON(c, &si, "-n", ns, "get", "serviceimport", name); err != nil {
			return err
		}
		return check(si)
	})
	return si
}

// exportManifest is a ServiceExport of ns/name.
func exportManifest(name, ns string) string {
	return "apiVersion: " + mcsv1alpha1.GroupVersion.String() + "\nkind: ServiceExport\nmetadata:\n  name: " + name + "\n  namespace: " + ns + "\n"
}

// mustKubectlApply applies manifest on c.
func mustKubectlApply(t *testing.T, c *federation.NodeCluster, manifest string) {
	t.Helper()
	cmd := exec.Command(federation.KubectlPath(), "--kubeconfig", c.CP.Kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply on %s: %v: %s\n%s", c.Name, err, out, manifest)
	}
}

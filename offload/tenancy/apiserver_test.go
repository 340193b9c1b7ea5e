package tenancy_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/flotilla-io/flotilla/offload/tenancy"
	"github.com/flotilla-io/flotilla/test/harness"
)

// FindAPIServer against a real API server, as an agent with only the
// rules it needs (agentRules) sees it: each source in its turn, what each
// refuses, and the error when none can serve.
func TestFindAPIServer(t *testing.T) {
	harness.Require(t, append(harness.NeedsControlPlane, harness.NeedsNetwork...)...)
	env := harness.New(t)
	cp := env.ControlPlane("cp1", harness.ControlPlaneOptions{LAN: env.NewLAN("lan")})
	agent := agentClient(t, cp)
	lanURL := cp.LANURL()
	badCA := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(badCA, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	ownData := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: cp.CA()}}
	ownFile := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: cp.CAFile()}}
	noCA := &rest.Config{}

	for _, tc := range []struct {
		name string
		// clusterInfo is the server of kube-public/cluster-info (none
		// when empty); slice the address:port of default/kubernetes.
		clusterInfo, slice string
		own                *rest.Config
		flagURL, flagCA    string
		wantSource         string
		wantURL            string
		wantSkipped        string
		wantErr            string
	}{
		{name: "flags win over discovery", clusterInfo: "https://198.18.200.1:6443", own: noCA,
			flagURL: lanURL, flagCA: cp.CAFile(), wantSource: tenancy.SourceFlag, wantURL: lanURL},
		{name: "flag URL with the agent's own CA file", own: ownFile,
			flagURL: lanURL, wantSource: tenancy.SourceFlag, wantURL: lanURL},
		{name: "flag URL without any CA", own: noCA, flagURL: lanURL, wantErr: "set --api-server-ca"},
		{name: "flag CA without URL", own: ownData, flagCA: cp.CAFile(), wantErr: "--api-server-url is not"},
		{name: "flag CA not PEM", own: ownData, flagURL: lanURL, flagCA: badCA, wantErr: "not PEM"},
		{name: "flag http", own: ownData, flagURL: "http://" + cp.LANAddr.String() + ":6443", wantErr: "want an https URL"},
		{name: "flag without host", own: ownData, flagURL: "https://:6443", wantErr: "has no host"},
		// A wrong flag is an error, never a reason to discover instead.
		{name: "flag loopback", clusterInfo: lanURL, own: ownData, flagURL: cp.Config.Host, wantErr: "loopback"},
		{name: "flag localhost", own: ownData, flagURL: "https://localhost:6443", wantErr: "localhost"},
		{name: "flag kubernetes Service address", own: ownData, flagURL: "https://10.96.0.1:443", wantErr: "kubernetes Service"},
		{name: "flag cluster DNS name", own: ownData, flagURL: "https://kubernetes.default.svc", wantErr: "cluster DNS name"},
		{name: "flag unspecified", own: ownData, flagURL: "https://0.0.0.0:6443", wantErr: "unspecified"},
		{name: "flag host name taken as written", own: ownData, flagURL: "https://api.provider.example:6443",
			wantSource: tenancy.SourceFlag, wantURL: "https://api.provider.example:6443"},
		// The CA comes from the ConfigMap: the agent's own has none.
		{name: "cluster-info", clusterInfo: lanURL, slice: cp.LANAddr.String() + ":7443", own: noCA,
			wantSource: tenancy.SourceClusterInfo, wantURL: lanURL},
		{name: "cluster-info loopback, then EndpointSlice", clusterInfo: "https://127.0.0.1:6443", slice: cp.LANAddr.String() + ":6443", own: ownData,
			wantSource: tenancy.SourceEndpointSlice, wantURL: lanURL, wantSkipped: "loopback"},
		{name: "EndpointSlice with the agent's own CA file", slice: cp.LANAddr.String() + ":6443", own: ownFile,
			wantSource: tenancy.SourceEndpointSlice, wantURL: lanURL, wantSkipped: "not a kubeadm cluster"},
		{name: "EndpointSlice without any CA", slice: cp.LANAddr.String() + ":6443", own: noCA, wantErr: "no CA bundle"},
		{name: "EndpointSlice of the kubernetes Service address", slice: "10.96.0.1:443", own: ownData, wantErr: "kubernetes Service"},
		{name: "nothing", own: ownData, wantErr: "set --api-server-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.clusterInfo != "" {
				createClusterInfo(t, cp, tc.clusterInfo)
			}
			if tc.slice != "" {
				createKubernetesSlice(t, cp, tc.slice)
			}
			got, err := tenancy.FindAPIServer(ctx, agent, tc.own, tc.flagURL, tc.flagCA)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("FindAPIServer = %+v, %v; want an error with %q", got, err, tc.wantErr)
				}
				if tc.flagURL == "" && tc.flagCA == "" && !strings.Contains(err.Error(), "set --api-server-url") {
					t.Fatalf("error %q does not say to set --api-server-url", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("FindAPIServer: %v", err)
			}
			if got.Source != tc.wantSource || got.URL != tc.wantURL {
				t.Fatalf("FindAPIServer = %s from %q, want %s from %q", got.URL, got.Source, tc.wantURL, tc.wantSource)
			}
			if !bytes.Equal(got.CAData, cp.CA()) {
				t.Fatalf("CA bundle from %s is not the control plane's:\n%s", got.Source, got.CAData)
			}
			if tc.wantSkipped != "" && !slices.ContainsFunc(got.Skipped, func(s string) bool { return strings.Contains(s, tc.wantSkipped) }) {
				t.Fatalf("Skipped = %q, want one saying %q", got.Skipped, tc.wantSkipped)
			}
		})
	}
}

// createClusterInfo writes kube-public/cluster-info as kubeadm does: a
// kubeconfig with one cluster named "", the server and the CA.
func createClusterInfo(t *testing.T, cp *harness.ControlPlane, server string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[""] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cp.CA()}
	raw, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cluster-info", Namespace: "kube-public"}, Data: map[string]string{"kubeconfig": string(raw)}}
	create(t, "ConfigMap kube-public/cluster-info", func(ctx context.Context) error {
		_, err := cp.Client.CoreV1().ConfigMaps("kube-public").Create(ctx, cm, metav1.CreateOptions{})
		return err
	}, func(ctx context.Context) error {
		return cp.Client.CoreV1().ConfigMaps("kube-public").Delete(ctx, "cluster-info", metav1.DeleteOptions{})
	})
}

// createKubernetesSlice writes default/kubernetes as the API server's
// endpoint reconciler does (the harness turns that reconciler off).
func createKubernetesSlice(t *testing.T, cp *harness.ControlPlane, addrPort string) {
	t.Helper()
	host, port, _ := strings.Cut(addrPort, ":")
	n, https, ready := mustPort(t, port), "https", true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &https, Port: &n}},
	}
	create(t, "EndpointSlice default/kubernetes", func(ctx context.Context) error {
		_, err := cp.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
		return err
	}, func(ctx context.Context) error {
		return cp.Client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{})
	})
}

func create(t *testing.T, what string, create, remove func(context.Context) error) {
	t.Helper()
	if err := create(context.Background()); err != nil {
		t.Fatalf("create %s: %v", what, err)
	}
	t.Cleanup(func() {
		if err := remove(context.Background()); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s: %v", what, err)
		}
	})
}

func mustPort(t *testing.T, s string) int32 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return int32(n)
}

// agentRules are all FindAPIServer needs: deploy/rbac.yaml grants the
// agent the same.
var agentRules = map[string][]rbacv1.PolicyRule{
	"kube-public": {{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"cluster-info"}, Verbs: []string{"get"}}},
	"default": {
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"services"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"get"}},
	},
}

// agentClient is a client of a ServiceAccount granted only agentRules.
func agentClient(t *testing.T, cp *harness.ControlPlane) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "default"}}
	if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for ns, rules := range agentRules {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "find-api-server", Namespace: ns}, Rules: rules}
		if _, err := cp.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "find-api-server", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
		}
		if _, err := cp.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := cp.Client.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(&rest.Config{Host: cp.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.CA()}})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

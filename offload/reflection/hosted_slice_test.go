package reflection

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/internal/offloadtest"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Three clusters' pod networks and views, for the pure tests and the
// integration test: consumer A offloads to providers P
// (offloadtest.OffsetViews of offloadenv.PodEnv) and B; A and P see B's
// pods in views of their own.
var (
	thirdPodCIDR    = netip.MustParsePrefix("10.1.0.0/16")
	consumerViewOfB = netip.MustParsePrefix("10.72.0.0/16")
	providerViewOfB = netip.MustParsePrefix("10.71.0.0/16")
)

// thirdClusterIDSeed is a well-formed cluster ID, for the pure tests.
const thirdClusterIDSeed = "cbbbbbbbbbbbbbbbbbbbbbbbbbb"

// manyViews is a consumer's views of several providers: the first that
// knows the provider answers.
type manyViews []offloadtest.OffsetViews

func (m manyViews) Translate(p string, a netip.Addr) (netip.Addr, bool) {
	for _, v := range m {
		if v.Provider == p {
			return v.Translate(p, a)
		}
	}
	return netip.Addr{}, false
}

func (m manyViews) ToRemote(p string, a netip.Addr) (netip.Addr, bool) {
	for _, v := range m {
		if v.Provider == p {
			return v.ToRemote(p, a)
		}
	}
	return netip.Addr{}, false
}

func (m manyViews) AsSeenBy(p string, a netip.Addr) (netip.Addr, bool) {
	for _, v := range m {
		if v.Provider == p {
			return v.AsSeenBy(p, a)
		}
	}
	return netip.Addr{}, false
}

// thirdSliceOf is what a consumer writes for cluster's endpoints of
// Service svc.
func thirdSliceOf(name, svc, cluster string, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mirrored", UID: "uid-1", Labels: map[string]string{
			offload.LabelReflected: "true", discoveryv1.LabelManagedBy: offload.ReflectionManagedBy,
			offload.LabelServiceName: svc, offload.LabelEndpointsOf: cluster,
		}, Annotations: map[string]string{offload.AnnotationOrigin: "app/" + name + "/uid"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: offloadtest.Ptr("http"), Port: offloadtest.Ptr(int32(8080))}},
	}
	ready := true
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

func TestDecodeThirdSliceRefusesWhatAConsumerMustNotSay(t *testing.T) {
	good := func() *discoveryv1.EndpointSlice { return thirdSliceOf("api-x", "api", thirdClusterIDSeed, "10.1.0.5") }
	for _, tc := range []struct {
		name   string
		mutate func(*discoveryv1.EndpointSlice)
		want   string // in the error; "" for none
	}{
		{"well formed", func(*discoveryv1.EndpointSlice) {}, ""},
		{"not reflected", func(s *discoveryv1.EndpointSlice) { delete(s.Labels, offload.LabelReflected) }, "not reflected"},
		{"managed by someone else", func(s *discoveryv1.EndpointSlice) {
			s.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
		}, "not reflected"},
		{"routable as it is", func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelServiceName] = "api" }, "kubernetes.io/service-name"},
		{"no cluster", func(s *discoveryv1.EndpointSlice) { delete(s.Labels, offload.LabelEndpointsOf) }, offload.LabelEndpointsOf},
		{"cluster not an ID", func(s *discoveryv1.EndpointSlice) { s.Labels[offload.LabelEndpointsOf] = "../etc" }, offload.LabelEndpointsOf},
		{"no service", func(s *discoveryv1.EndpointSlice) { delete(s.Labels, offload.LabelServiceName) }, offload.LabelServiceName},
		{"service not a name", func(s *discoveryv1.EndpointSlice) { s.Labels[offload.LabelServiceName] = "API" }, offload.LabelServiceName},
		{"FQDN", func(s *discoveryv1.EndpointSlice) { s.AddressType = discoveryv1.AddressTypeFQDN }, "address type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.mutate(s)
			src, err := decodeThirdSlice(s)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && (src.cluster != thirdClusterIDSeed || src.service != "api"):
				t.Fatalf("decoded %+v", src)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestTranslateThirdUsesThisClustersViewOfTheNamedCluster(t *testing.T) {
	views := manyViews{{Provider: thirdClusterIDSeed, Real: thirdPodCIDR, View: providerViewOfB}}
	src := thirdSliceOf("api-x", "api", thirdClusterIDSeed, "10.1.3.4", "10.9.0.1", "10.1.0.7", "not-an-ip")
	from, err := decodeThirdSlice(src)
	if err != nil {
		t.Fatal(err)
	}
	got, dropped := translateThird(src, from, views.Translate)
	var addrs []string
	for _, e := range got.Endpoints {
		addrs = append(addrs, e.Addresses...)
		if e.Conditions.Ready == nil || !*e.Conditions.Ready {
			t.Fatalf("endpoint %v lost its conditions", e.Addresses)
		}
	}
	if !slices.Equal(addrs, []string{"10.71.3.4", "10.71.0.7"}) || dropped != 2 {
		t.Fatalf("addresses %v, dropped %d; want 10.71.3.4 and 10.71.0.7 (this cluster's view of the third), 2 dropped", addrs, dropped)
	}
	if got.Labels[discoveryv1.LabelServiceName] != "api" || got.Labels[discoveryv1.LabelManagedBy] != offload.HostedEndpointsManagedBy ||
		got.Labels[offload.LabelEndpointsOf] != thirdClusterIDSeed {
		t.Fatalf("labels %v", got.Labels)
	}
	if len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != src.UID || got.OwnerReferences[0].Name != src.Name {
		t.Fatalf("owner %v, want the source slice", got.OwnerReferences)
	}
	if got.Namespace != src.Namespace || len(got.Ports) != 1 || *got.Ports[0].Port != 8080 {
		t.Fatalf("namespace %s, ports %v", got.Namespace, got.Ports)
	}
}

func TestThirdClusterSlicesCarryWhatTheProviderCannotReach(t *testing.T) {
	const p, b = "cpppppppppppppppppppppppppp", thirdClusterIDSeed
	views := manyViews{
		{Provider: p, Real: offloadtest.ProviderPodCIDR, View: offloadtest.ViewOfProviderPods},
		{Provider: b, Real: thirdPodCIDR, View: consumerViewOfB},
	}
	ready := true
	local := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "api-abcde", UID: "u1", Labels: map[string]string{
			discoveryv1.LabelServiceName: "api", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, NodeName: offloadtest.Ptr("worker"), Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"10.70.3.4"}, NodeName: offloadtest.Ptr(offload.VirtualNodeName(p))},
			{Addresses: []string{"10.72.5.6"}, NodeName: offloadtest.Ptr(offload.VirtualNodeName(b)), Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			// Outside this cluster's view of b: dropped, counted.
			{Addresses: []string{"10.99.0.1"}, NodeName: offloadtest.Ptr(offload.VirtualNodeName(b))},
		},
	}
	tr := endpointTranslator{provider: p, views: views}
	main, dropped := reflectedSlice(local, "mirrored", tr)
	if len(main.Endpoints) != 2 || dropped[dropThirdCluster] != 1 || dropped[dropUntranslatable] != 0 {
		t.Fatalf("main slice %v, dropped %v: want 2 endpoints, the one outside every view dropped as third_cluster", main.Endpoints, dropped)
	}
	third := thirdClusterSlices(local, "mirrored", tr)
	if len(third) != 1 {
		t.Fatalf("third-cluster slices %v, want one", slices.Collect(func(yield func(string) bool) {
			for n := range third {
				yield(n)
			}
		}))
	}
	s := third[thirdSliceName("api-abcde", b)]
	if s == nil {
		t.Fatalf("no slice %s", thirdSliceName("api-abcde", b))
	}
	if len(s.Endpoints) != 1 || !slices.Equal(s.Endpoints[0].Addresses, []string{"10.1.5.6"}) || s.Endpoints[0].NodeName != nil {
		t.Fatalf("endpoints %+v, want b's own 10.1.5.6 only", s.Endpoints)
	}
	// What the provider decodes is what the consumer wrote.
	src, err := decodeThirdSlice(s)
	if err != nil || src.cluster != b || src.service != "api" {
		t.Fatalf("provider decodes %+v, %v", src, err)
	}
	if ns, name, ok := reflectedOrigin(s); !ok || ns != "app" || name != "api-abcde" {
		t.Fatalf("origin %v %v", s.Labels, s.Annotations)
	}
}

func TestDerivedNamesAreValidAndApart(t *testing.T) {
	long := strings.Repeat("a", 250)
	for _, n := range []string{derivedName("api-x", "translated"), derivedName(long, "translated"), derivedName(long[:249]+".", "translated"), derivedName(long+"b", "translated")} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Fatalf("%q: %v", n, errs)
		}
	}
	if derivedName(long, "x") == derivedName(long+"b", "x") {
		t.Fatal("two long names derive the same")
	}
}

// FuzzDecodeThirdSlice: whatever a consumer writes in a slice's labels,
// address type and addresses, the provider refuses it with an error or
// translates it into a slice with only valid addresses of the named
// family, for the named Service.
func FuzzDecodeThirdSlice(f *testing.F) {
	f.Add("true", offload.ReflectionManagedBy, "api", thirdClusterIDSeed, "", "IPv4", "10.1.0.5")
	f.Add("true", offload.ReflectionManagedBy, "api", thirdClusterIDSeed, "api", "IPv4", "10.1.0.5")
	f.Add("true", offload.ReflectionManagedBy, "x", "c", "", "IPv6", "fd00::1")
	f.Add("false", "", "", "", "", "FQDN", "example.com")
	f.Add("true", offload.ReflectionManagedBy, "api", thirdClusterIDSeed, "", "IPv6", "10.1.0.5")
	views := manyViews{{Provider: thirdClusterIDSeed, Real: thirdPodCIDR, View: providerViewOfB}}
	f.Fuzz(func(t *testing.T, reflected, managedBy, svc, cluster, k8sSvc, family, addr string) {
		s := thirdSliceOf("api-x", svc, cluster, addr)
		s.Labels[offload.LabelReflected], s.Labels[discoveryv1.LabelManagedBy] = reflected, managedBy
		if k8sSvc != "" {
			s.Labels[discoveryv1.LabelServiceName] = k8sSvc
		}
		s.AddressType = discoveryv1.AddressType(family)
		src, err := decodeThirdSlice(s)
		if err != nil {
			return
		}
		got, dropped := translateThird(s, src, views.Translate)
		if got.Labels[discoveryv1.LabelServiceName] != svc || len(got.Endpoints)+dropped != 1 {
			t.Fatalf("labels %v, %d endpoints, %d dropped", got.Labels, len(got.Endpoints), dropped)
		}
		for _, e := range got.Endpoints {
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || ip.Is4() != (src.family == discoveryv1.AddressTypeIPv4) || !providerViewOfB.Contains(ip) {
					t.Fatalf("address %q in a slice of %s", a, src.family)
				}
			}
		}
	})
}

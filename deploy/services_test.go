package deploy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/mcs"
)

// With its own token the agent writes the Services and EndpointSlices of
// its imports (labelled as its own) in a user's namespace, and no other:
// not a user's Service, not one it did not label, and it cannot adopt a
// user's Service by labelling it.
func (g *grant) testServiceObjects(t *testing.T) {
	ctx := t.Context()
	ns := "default"
	admin := g.cp.Client.CoreV1().Services(ns)
	services, slices := g.agent.CoreV1().Services(ns), g.agent.DiscoveryV1().EndpointSlices(ns)
	create, del := metav1.CreateOptions{}, metav1.DeleteOptions{}

	user, err := admin.Create(ctx, service("users-front", corev1.ServiceTypeClusterIP), create)
	if err != nil {
		t.Fatal(err)
	}
	ours := service(mcs.DerivedServiceName("front"), corev1.ServiceTypeClusterIP)
	ours.Spec.Selector = nil
	ours.Labels = map[string]string{mcs.LabelManagedBy: mcs.ManagedBy}
	derived, err := services.Create(ctx, ours, create)
	if err != nil {
		t.Fatalf("the agent creates a derived Service: %v", err)
	}
	if _, err := services.Patch(ctx, derived.Name, types.MergePatchType, []byte(`{"spec":{"ports":[{"port":81}]}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("the agent updates its derived Service: %v", err)
	}
	port, proto := int32(8080), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: derived.Name + "-x-0", Labels: map[string]string{
			discoveryv1.LabelManagedBy: mcs.ManagedBy, discoveryv1.LabelServiceName: derived.Name, mcs.LabelServiceName: "front"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.200.0.5"}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: &proto}},
	}
	if _, err := slices.Create(ctx, slice, create); err != nil {
		t.Fatalf("the agent creates an imported EndpointSlice: %v", err)
	}

	// A consumer's endpoints on a third cluster, translated
	// (reflection.HostedEndpoints): a slice of its own, managed by
	// endpoints.flotilla.io, in a namespace mirrored for the consumer.
	mirrored := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "api-q3x7bd", Labels: mirroredLabels("api")}}
	if _, err := g.cp.Client.CoreV1().Namespaces().Create(ctx, mirrored, create); err != nil {
		t.Fatal(err)
	}
	defer g.cp.Client.CoreV1().Namespaces().Delete(ctx, mirrored.Name, del)
	mirroredSlices := g.agent.DiscoveryV1().EndpointSlices(mirrored.Name)
	translated := slice.DeepCopy()
	translated.Name, translated.Labels = "api-x-translated", map[string]string{
		discoveryv1.LabelManagedBy: offload.HostedEndpointsManagedBy, discoveryv1.LabelServiceName: "api"}
	if _, err := mirroredSlices.Create(ctx, translated, create); err != nil {
		t.Fatalf("the agent creates a translated EndpointSlice: %v", err)
	}
	// A slice the user's own controller keeps: one labelled as the
	// EndpointSlice controller's would be deleted by it (the Service
	// selects no pod), maybe before the agent's patch is refused.
	usersSlice := slice.DeepCopy()
	usersSlice.Name, usersSlice.Labels = "users-front-y", map[string]string{discoveryv1.LabelManagedBy: "endpoints.example.com", discoveryv1.LabelServiceName: user.Name}
	if _, err := g.cp.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, usersSlice, create); err != nil {
		t.Fatal(err)
	}

	unlabelled := service("not-ours", corev1.ServiceTypeClusterIP)
	foreignSlice := slice.DeepCopy()
	foreignSlice.Name, foreignSlice.Labels = "users-front-x", map[string]string{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", discoveryv1.LabelServiceName: user.Name}
	for _, tt := range []struct {
		what string
		do   func() error
	}{
		{"create an unlabelled Service", func() error { _, err := services.Create(ctx, unlabelled, create); return err }},
		{"delete a user's Service", func() error { return services.Delete(ctx, user.Name, del) }},
		{"adopt a user's Service by labelling it", func() error {
			_, err := services.Patch(ctx, user.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"app.kubernetes.io/managed-by":"mcs.flotilla.io"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"create a slice of a user's Service", func() error { _, err := slices.Create(ctx, foreignSlice, create); return err }},
		{"adopt a user's slice by labelling it as a translation", func() error {
			_, err := slices.Patch(ctx, usersSlice.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"endpointslice.kubernetes.io/managed-by":"endpoints.flotilla.io"}}}`), metav1.PatchOptions{})
			return err
		}},
	} {
		t.Run(tt.what, func(t *testing.T) {
			if err := tt.do(); err == nil || !containsPolicy(err, "flotilla-agent-service-objects") {
				t.Fatalf("err = %v, want a refusal by flotilla-agent-service-objects", err)
			}
		})
	}
	if err := mirroredSlices.Delete(ctx, translated.Name, del); err != nil {
		t.Errorf("the agent deletes its translated EndpointSlice: %v", err)
	}
	if err := slices.Delete(ctx, slice.Name, del); err != nil {
		t.Errorf("the agent deletes its EndpointSlice: %v", err)
	}
	if err := services.Delete(ctx, derived.Name, del); err != nil {
		t.Errorf("the agent deletes its derived Service: %v", err)
	}
	if _, err := admin.Get(ctx, user.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the user's Service: %v", err)
	}
}

// containsPolicy says whether err is a refusal by the named policy.
func containsPolicy(err error, policy string) bool {
	return strings.Contains(err.Error(), "'"+policy+"'")
}

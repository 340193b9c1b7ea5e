package agent

import (
	"context"
	"testing"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"

	"github.com/flotilla-io/flotilla/test/harness"
)

// The CRDs are applied when missing or different from the embedded ones,
// and left alone when in place: a restart reads them and writes nothing.
func TestCRDsAppliedOnlyWhenNotInPlace(t *testing.T) {
	harness.Require(t, harness.NeedsControlPlane...)
	env := harness.New(t)
	cp := env.ControlPlane("crds", harness.ControlPlaneOptions{})
	cfg, writes := harness.RecordRequests(cp.Config, harness.Writes)
	written := writes.Take
	ctx := context.Background()

	if err := installCRDs(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if w := written(); len(w) == 0 {
		t.Fatal("first start: nothing written")
	}
	if err := installCRDs(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if w := written(); len(w) != 0 {
		t.Fatalf("a start with the CRDs in place wrote %v", w)
	}

	// As an agent of another version left it: applied again.
	cs, err := apiextensionsclient.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds := cs.ApiextensionsV1().CustomResourceDefinitions()
	list, err := crds.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("CRDs: %v, %v", list, err)
	}
	crd := list.Items[0]
	crd.Annotations[crdDigestAnnotation] = "another"
	if _, err := crds.Update(ctx, &crd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := installCRDs(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if w := written(); len(w) != 1 {
		t.Fatalf("a start with another version's CRD wrote %v, want one apply", w)
	}

	// The Multi-Cluster Services API's CRD as another implementation
	// installed it (a newer release, no digest of ours): left alone.
	se, err := crds.Get(ctx, "serviceexports.multicluster.x-k8s.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(se.Annotations, crdDigestAnnotation)
	se.Labels[mcscrd.ReleaseVersionLabel] = "v9.9.9"
	if _, err := crds.Update(ctx, se, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := installCRDs(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if w := written(); len(w) != 0 {
		t.Fatalf("a start with another implementation's ServiceExport CRD wrote %v", w)
	}
	if got, err := crds.Get(ctx, se.Name, metav1.GetOptions{}); err != nil || got.Labels[mcscrd.ReleaseVersionLabel] != "v9.9.9" {
		t.Fatalf("the other implementation's CRD: %v, release %q", err, got.Labels[mcscrd.ReleaseVersionLabel])
	}
}

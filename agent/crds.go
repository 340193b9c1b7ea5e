package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	mcscrd "sigs.k8s.io/mcs-api/config/crd"

	"github.com/flotilla-io/flotilla/deploy"
)

// crdDigestAnnotation names the embedded CRD an agent applied. A start that
// finds it in place, established, leaves it be: one read instead of a
// server-side apply, which took a loaded API server 100-200 ms (of an
// agent's 600 ms to gossip) on every start.
const crdDigestAnnotation = "flotilla.io/crd-digest"

// ensureCRDs runs installCRDs unless the admin installs the CRDs
// (--install-crds=false); the start runs it in the background.
func (a *Agent) ensureCRDs(ctx context.Context) (struct{}, error) {
	if !a.cfg.InstallCRDs {
		return struct{}{}, nil
	}
	return struct{}{}, installCRDs(ctx, a.restCfg)
}

// installCRDs applies the embedded CRDs that are not in place yet
// (server-side apply, field owner "flotilla") and waits until they are
// established.
func installCRDs(ctx context.Context, cfg *rest.Config) error {
	// A typed client: it needs no discovery of the API first.
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client for CRDs: %w", err)
	}
	crds := cs.ApiextensionsV1().CustomResourceDefinitions()
	files, err := fs.Glob(deploy.CRDs, "crds/*.yaml")
	if err != nil {
		return err
	}
	for _, f := range files {
		raw, err := fs.ReadFile(deploy.CRDs, f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			return fmt.Errorf("embedded %s: %w", f, err)
		}
		sum := sha256.Sum256(raw)
		digest := hex.EncodeToString(sum[:8])
		got, err := crds.Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case err == nil && got.Annotations[crdDigestAnnotation] == digest && established(got):
			continue
		case err == nil && installedByOther(got):
			// Another Multi-Cluster Services implementation's CRD, perhaps
			// of a newer release: not ours to downgrade.
			continue
		case err != nil && !apierrors.IsNotFound(err):
			return fmt.Errorf("read CRD %s: %w (or install it with kubectl apply -f deploy/crds and run with --install-crds=false)", crd.Name, err)
		}
		crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		if crd.Annotations == nil {
			crd.Annotations = map[string]string{}
		}
		crd.Annotations[crdDigestAnnotation] = digest
		body, err := json.Marshal(&crd)
		if err != nil {
			return fmt.Errorf("embedded %s: %w", f, err)
		}
		force := true
		if _, err := crds.Patch(ctx, crd.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "flotilla", Force: &force}); err != nil {
			return fmt.Errorf("install CRD %s: %w (or install it with kubectl apply -f deploy/crds and run with --install-crds=false)", crd.Name, err)
		}
		err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := crds.Get(ctx, crd.Name, metav1.GetOptions{})
			return err == nil && established(got), nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	return nil
}

// installedByOther says whether crd is one of the Multi-Cluster Services
// API's CRDs (which carry its release label) that no agent applied.
func installedByOther(crd *apiextensionsv1.CustomResourceDefinition) bool {
	_, upstream := crd.Labels[mcscrd.ReleaseVersionLabel]
	_, ours := crd.Annotations[crdDigestAnnotation]
	return upstream && !ours
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1client "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
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

// crdEstablishTimeout bounds the wait for the API server to establish a
// CRD the agent applied, in well under a second when it is healthy. An
// API server so loaded that its answers come seconds late (seen for half
// a minute on a 2-core machine) is waited for rather than left by an
// agent that exits and waits out its restart's back-off.
const crdEstablishTimeout = 2 * time.Minute

// peerCRD is the one CRD the network path needs: the Peer informer
// waits for it before the gossip join. The others only offloading and the
// Multi-Cluster Services need, after it.
const peerCRD = "crds/flotilla.io_peers.yaml"

// ensureCRDs returns a start step that runs installCRDs, unless the admin
// installs the CRDs (--install-crds=false), for the Peer's CRD
// (networkPath) or for every other one; the start runs both in the
// background.
func (a *Agent) ensureCRDs(networkPath bool) func(context.Context) (struct{}, error) {
	return func(ctx context.Context) (struct{}, error) {
		if !a.cfg.InstallCRDs {
			return struct{}{}, nil
		}
		files, err := crdFiles()
		if err != nil {
			return struct{}{}, err
		}
		files = slices.DeleteFunc(files, func(f string) bool { return (f == peerCRD) != networkPath })
		return struct{}{}, installCRDFiles(ctx, a.restCfg, files)
	}
}

// crdFiles are the embedded CRDs' files.
func crdFiles() ([]string, error) {
	files, err := fs.Glob(deploy.CRDs, "crds/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("embedded CRDs: %w", err)
	}
	return files, nil
}

// installCRDs applies every embedded CRD that is not in place yet
// (installCRDFiles).
func installCRDs(ctx context.Context, cfg *rest.Config) error {
	files, err := crdFiles()
	if err != nil {
		return err
	}
	return installCRDFiles(ctx, cfg, files)
}

// installCRDFiles applies the embedded CRDs of files that are not in place
// yet (server-side apply, field owner "flotilla") and waits until they are
// established, each on its own: a start waits for the slowest, not for
// the sum.
func installCRDFiles(ctx context.Context, cfg *rest.Config, files []string) error {
	// A typed client: it needs no discovery of the API first.
	cs, err := apiextensionsv1client.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client for CRDs: %w", err)
	}
	crds := cs.CustomResourceDefinitions()
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Go(func() { errs[i] = installCRD(ctx, crds, f) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// installCRD applies the embedded CRD of file f unless it is in place,
// established, and waits until it is.
func installCRD(ctx context.Context, crds apiextensionsv1client.CustomResourceDefinitionInterface, f string) error {
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
		return nil
	case err == nil && installedByOther(got):
		// Another Multi-Cluster Services implementation's CRD, perhaps
		// of a newer release: not ours to downgrade.
		return nil
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
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, crdEstablishTimeout, true, func(ctx context.Context) (bool, error) {
		got, err := crds.Get(ctx, crd.Name, metav1.GetOptions{})
		return err == nil && established(got), nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established within %s (the API server establishes it; is it overloaded?): %w", crd.Name, crdEstablishTimeout, err)
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

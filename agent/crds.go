package agent

import (
	"context"
	"fmt"
	"io/fs"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/deploy"
)

// installCRDs applies the embedded CRDs (server-side apply, field owner
// "flotilla") and waits until they are established.
func installCRDs(ctx context.Context, cfg *rest.Config) error {
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("client for CRDs: %w", err)
	}
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
		crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		if err := c.Patch(ctx, &crd, client.Apply, client.FieldOwner("flotilla"), client.ForceOwnership); err != nil {
			return fmt.Errorf("install CRD %s: %w (or install it with kubectl apply -f deploy/crds and run with --install-crds=false)", crd.Name, err)
		}
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var got apiextensionsv1.CustomResourceDefinition
			if err := c.Get(ctx, client.ObjectKey{Name: crd.Name}, &got); err != nil {
				return false, nil
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	return nil
}

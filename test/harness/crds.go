package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// ApplyCRDs creates the CRDs of the files of fsys matching pattern (the
// project's embedded deploy.CRDs, say) and waits until each is
// established. It returns an error rather than failing a test, so that
// it can run from a goroutine.
func ApplyCRDs(ctx context.Context, cfg *rest.Config, fsys fs.FS, pattern string) error {
	crds := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()
	files, err := fs.Glob(fsys, pattern)
	if err != nil || len(files) == 0 {
		return fmt.Errorf("CRDs %s: %v (%d files)", pattern, err, len(files))
	}
	for _, f := range files {
		raw, err := fs.ReadFile(fsys, f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := crds.Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
		established := func() error {
			got, err := crds.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
			return errors.New("not established")
		}
		deadline := time.Now().Add(30 * time.Second)
		for err := established(); err != nil; err = established() {
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s: %w", crd.Name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

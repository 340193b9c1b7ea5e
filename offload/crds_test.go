package offload

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/test/harness"
)

// applyCRDs creates the embedded CRDs, as the agent does at start, and
// waits until each is established. It returns an error rather than
// failing a test, so that it can run from a goroutine.
func applyCRDs(ctx context.Context, cfg *rest.Config) error {
	crds := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()
	files, err := fs.Glob(deploy.CRDs, "crds/*.yaml")
	if err != nil || len(files) == 0 {
		return fmt.Errorf("embedded CRDs: %v (%d files)", err, len(files))
	}
	for _, f := range files {
		raw, err := fs.ReadFile(deploy.CRDs, f)
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

func mustApplyCRDs(t testing.TB, cfg *rest.Config) {
	t.Helper()
	if err := applyCRDs(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}

// mustApplyCRDsTo applies the CRDs to every control plane at once.
func mustApplyCRDsTo(tb testing.TB, cps ...*harness.ControlPlane) {
	tb.Helper()
	var wg sync.WaitGroup
	for _, cp := range cps {
		wg.Go(func() {
			if err := applyCRDs(context.Background(), cp.Config); err != nil {
				tb.Error(err)
			}
		})
	}
	wg.Wait()
	if tb.Failed() {
		tb.FailNow()
	}
}

// runController runs a controller's Run until the stop it returns is
// called, once, or the test ends; an error from Run fails the test,
// named what.
func runController(t testing.TB, what string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

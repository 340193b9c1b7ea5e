package deploy

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// manifests are the files kustomization.yaml lists.
//
//go:embed kustomization.yaml *.yaml crds/*.yaml
var manifests embed.FS

// OwnGroup is the API group of Flotilla's own CRDs. A CRD of another group
// (the Multi-Cluster Services API's, the About API's ClusterProperty) is
// shared with other implementations that may use it too.
const OwnGroup = "flotilla.io"

// Objects are the objects `kubectl apply -k deploy/` installs, in the
// order kustomization.yaml lists their files.
func Objects() ([]*unstructured.Unstructured, error) {
	raw, err := fs.ReadFile(manifests, "kustomization.yaml")
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := sigsyaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("deploy/kustomization.yaml: %w", err)
	}
	var objs []*unstructured.Unstructured
	for _, f := range k.Resources {
		raw, err := fs.ReadFile(manifests, f)
		if err != nil {
			return nil, fmt.Errorf("deploy/kustomization.yaml lists %s: %w", f, err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("deploy/%s: %w", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			objs = append(objs, &u)
		}
	}
	return objs, nil
}

// SharedCRD says whether obj is a CustomResourceDefinition of an API that
// other implementations share: deleting it deletes their objects too.
func SharedCRD(obj *unstructured.Unstructured) bool {
	if obj.GetKind() != "CustomResourceDefinition" {
		return false
	}
	group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
	return group != OwnGroup
}

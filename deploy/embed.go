// Package deploy holds the manifests that install Flotilla: the CRDs
// (generated from api/ by `make generate`), RBAC, admission policies and the
// agent Deployment. The CRDs are embedded so the agent can install them
// itself, the policies' names so that it can prove them in force.
package deploy

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"k8s.io/apimachinery/pkg/util/yaml"
)

// CRDs are the CustomResourceDefinitions, one YAML file each.
//
//go:embed crds/*.yaml
var CRDs embed.FS

// admission holds the admission policies: the agent proves them in force
// before it grants anything (tenancy.Fences).
//
//go:embed admission*.yaml
var admission embed.FS

// AdmissionPolicies are the names of the ValidatingAdmissionPolicies
// deploy/ installs, each bound by a ValidatingAdmissionPolicyBinding of
// the same name.
func AdmissionPolicies() ([]string, error) {
	files, err := fs.Glob(admission, "admission*.yaml")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range files {
		raw, err := fs.ReadFile(admission, f)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var doc struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("deploy/%s: %w", f, err)
			}
			if doc.Kind == "ValidatingAdmissionPolicy" {
				names = append(names, doc.Metadata.Name)
			}
		}
	}
	if len(names) == 0 {
		return nil, errors.New("deploy/ holds no ValidatingAdmissionPolicy")
	}
	return names, nil
}

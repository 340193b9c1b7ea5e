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

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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

// AdmissionBindings are the ValidatingAdmissionPolicyBindings deploy/
// installs, each binding the policy of the same name.
func AdmissionBindings() ([]admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	files, err := fs.Glob(admission, "admission*.yaml")
	if err != nil {
		return nil, err
	}
	var bindings []admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, f := range files {
		raw, err := fs.ReadFile(admission, f)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
			if err := dec.Decode(&b); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("deploy/%s: %w", f, err)
			}
			if b.Kind == "ValidatingAdmissionPolicyBinding" {
				bindings = append(bindings, b)
			}
		}
	}
	if len(bindings) == 0 {
		return nil, errors.New("deploy/ holds no ValidatingAdmissionPolicyBinding")
	}
	return bindings, nil
}

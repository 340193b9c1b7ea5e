// Package deploy holds the manifests that install Flotilla: the CRDs
// (generated from api/ by `make generate`), RBAC and the agent Deployment.
// The CRDs are embedded so the agent can install them itself.
package deploy

import "embed"

// CRDs are the CustomResourceDefinitions, one YAML file each.
//
//go:embed crds/*.yaml
var CRDs embed.FS

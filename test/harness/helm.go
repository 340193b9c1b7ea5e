package harness

import (
	_ "embed"
	"strings"
)

//go:embed helm-version
var helmVersionFile string

// HelmVersion is the pinned Helm release the chart's tests install
// charts/flotilla with. hack/build-helm.sh reads the same file.
var HelmVersion = strings.TrimSpace(helmVersionFile)

// HelmBinary is helm of HelmVersion as hack/build-helm.sh builds it into
// the cache.
func HelmBinary() string { return cachedBinary("helm", HelmVersion, "helm") }

// Helm is the helm CLI, for the tests that install, upgrade and uninstall
// charts/flotilla with it.
var Helm = cachedRequirement("helm "+HelmVersion, HelmBinary, "make helm")

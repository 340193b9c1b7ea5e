package harness

import (
	_ "embed"
	"errors"
	"os"
	"path/filepath"
	"strings"
)

//go:embed prometheus-operator-version
var prometheusOperatorVersionFile string

// PrometheusOperatorVersion is the pinned Prometheus Operator release
// whose CRDs deploy/monitoring's objects are applied against.
// hack/fetch-prometheus-operator-crds.sh reads the same file.
var PrometheusOperatorVersion = strings.TrimSpace(prometheusOperatorVersionFile)

// PrometheusOperatorCRDs are the operator's own CustomResourceDefinitions
// of PodMonitor, ServiceMonitor and PrometheusRule, as its release ships
// them (example/prometheus-operator-crd), copied from its module source
// into the cache.
func PrometheusOperatorCRDs() []string {
	dir := filepath.Join(CacheDir(), "prometheus-operator", PrometheusOperatorVersion, "crds")
	var files []string
	for _, kind := range []string{"podmonitors", "servicemonitors", "prometheusrules"} {
		files = append(files, filepath.Join(dir, "monitoring.coreos.com_"+kind+".yaml"))
	}
	return files
}

// PrometheusOperator is met once those CRDs are in the cache.
var PrometheusOperator = Requirement{
	Name: "Prometheus Operator " + PrometheusOperatorVersion + " CRDs",
	Check: func() error {
		var errs []error
		for _, f := range PrometheusOperatorCRDs() {
			_, err := os.Stat(f)
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	},
	Fix: "make prometheus-operator-crds",
}

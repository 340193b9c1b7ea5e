package conformance

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Context is one cluster of the suite's kubeconfig: the context, cluster
// and user all take its Name, so no two clusters share a user name (the
// suite tells clusters apart by them).
type Context struct {
	Name   string
	Config *rest.Config // an admin's: server, CA, client certificate and key
}

// WriteKubeconfig writes one kubeconfig holding every context to path,
// readable by its owner only (it holds the admins' keys), the first
// context current.
func WriteKubeconfig(path string, contexts []Context) error {
	cfg := clientcmdapi.NewConfig()
	for _, c := range contexts {
		if _, dup := cfg.Contexts[c.Name]; dup || c.Name == "" {
			return fmt.Errorf("kubeconfig context %q: want distinct, non-empty names", c.Name)
		}
		tls := c.Config.TLSClientConfig
		cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: tls.CAData}
		cfg.AuthInfos[c.Name] = &clientcmdapi.AuthInfo{ClientCertificateData: tls.CertData, ClientKeyData: tls.KeyData, Token: c.Config.BearerToken}
		cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: c.Name}
		if cfg.CurrentContext == "" {
			cfg.CurrentContext = c.Name
		}
	}
	// WriteToFile creates the file with mode 0600.
	return clientcmd.WriteToFile(*cfg, path)
}

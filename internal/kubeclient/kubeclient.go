// Package kubeclient is the client of a cluster's API server that the
// agent and the operator commands share: typed clients of only the API
// groups they use, over one transport, and informers of one kind each.
// client-go's full clientset and its informer factory link every API group
// Kubernetes serves (a few MB of the binary); this links nine.
package kubeclient

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/discovery"
	admissionregistrationv1 "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	appsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	networkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1"
	rbacv1 "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Interface is what of a cluster's API the agent uses. client-go's
// kubernetes.Interface (and its fake, in tests) satisfies it too.
type Interface interface {
	Discovery() discovery.DiscoveryInterface
	AdmissionregistrationV1() admissionregistrationv1.AdmissionregistrationV1Interface
	AppsV1() appsv1.AppsV1Interface
	AuthenticationV1() authenticationv1.AuthenticationV1Interface
	AuthorizationV1() authorizationv1.AuthorizationV1Interface
	CoordinationV1() coordinationv1.CoordinationV1Interface
	CoreV1() corev1.CoreV1Interface
	DiscoveryV1() discoveryv1.DiscoveryV1Interface
	NetworkingV1() networkingv1.NetworkingV1Interface
	RbacV1() rbacv1.RbacV1Interface
}

// Clientset is Interface over one rest.Config and one http.Client.
type Clientset struct {
	discovery               *discovery.DiscoveryClient
	admissionregistrationV1 *admissionregistrationv1.AdmissionregistrationV1Client
	appsV1                  *appsv1.AppsV1Client
	authenticationV1        *authenticationv1.AuthenticationV1Client
	authorizationV1         *authorizationv1.AuthorizationV1Client
	coordinationV1          *coordinationv1.CoordinationV1Client
	coreV1                  *corev1.CoreV1Client
	discoveryV1             *discoveryv1.DiscoveryV1Client
	networkingV1            *networkingv1.NetworkingV1Client
	rbacV1                  *rbacv1.RbacV1Client
}

var _ Interface = (*Clientset)(nil)

// NewForConfig is a Clientset whose clients share one transport, made
// from cfg as client-go's kubernetes.NewForConfig makes it.
func NewForConfig(cfg *rest.Config) (*Clientset, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	hc, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("client of %s: %w", c.Host, err)
	}
	return NewForConfigAndClient(&c, hc)
}

// NewOwnConnection is NewForConfig over connections of its own to the
// API server, which no other client shares. On a shared HTTP/2
// connection a request waits for the others' headers to be written one
// at a time, and its response behind theirs on the one stream of bytes
// the connection reads: on a busy process, a small request queued
// behind an informer's list can take seconds. For the few requests that
// must go through then: the Lease's.
func NewOwnConnection(cfg *rest.Config) (*Clientset, error) {
	c := *cfg
	// A dial function of its own: client-go shares a transport only
	// between configurations with the same one.
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	c.Dial = d.DialContext
	return NewForConfig(&c)
}

// NewForConfigAndClient is a Clientset whose clients all use hc.
func NewForConfigAndClient(cfg *rest.Config, hc *http.Client) (*Clientset, error) {
	c := *cfg
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("client of %s: a QPS without a burst", c.Host)
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	var cs Clientset
	var errs [10]error
	cs.discovery, errs[0] = discovery.NewDiscoveryClientForConfigAndClient(&c, hc)
	cs.admissionregistrationV1, errs[1] = admissionregistrationv1.NewForConfigAndClient(&c, hc)
	cs.appsV1, errs[2] = appsv1.NewForConfigAndClient(&c, hc)
	cs.authenticationV1, errs[3] = authenticationv1.NewForConfigAndClient(&c, hc)
	cs.authorizationV1, errs[4] = authorizationv1.NewForConfigAndClient(&c, hc)
	cs.coordinationV1, errs[5] = coordinationv1.NewForConfigAndClient(&c, hc)
	cs.coreV1, errs[6] = corev1.NewForConfigAndClient(&c, hc)
	cs.discoveryV1, errs[7] = discoveryv1.NewForConfigAndClient(&c, hc)
	cs.networkingV1, errs[8] = networkingv1.NewForConfigAndClient(&c, hc)
	cs.rbacV1, errs[9] = rbacv1.NewForConfigAndClient(&c, hc)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("client of %s: %w", c.Host, err)
	}
	return &cs, nil
}

func (c *Clientset) Discovery() discovery.DiscoveryInterface { return c.discovery }

func (c *Clientset) AdmissionregistrationV1() admissionregistrationv1.AdmissionregistrationV1Interface {
	return c.admissionregistrationV1
}
func (c *Clientset) AppsV1() appsv1.AppsV1Interface { return c.appsV1 }
func (c *Clientset) AuthenticationV1() authenticationv1.AuthenticationV1Interface {
	return c.authenticationV1
}
func (c *Clientset) AuthorizationV1() authorizationv1.AuthorizationV1Interface {
	return c.authorizationV1
}
func (c *Clientset) CoordinationV1() coordinationv1.CoordinationV1Interface { return c.coordinationV1 }
func (c *Clientset) CoreV1() corev1.CoreV1Interface                         { return c.coreV1 }
func (c *Clientset) DiscoveryV1() discoveryv1.DiscoveryV1Interface          { return c.discoveryV1 }
func (c *Clientset) NetworkingV1() networkingv1.NetworkingV1Interface       { return c.networkingV1 }
func (c *Clientset) RbacV1() rbacv1.RbacV1Interface                         { return c.rbacV1 }

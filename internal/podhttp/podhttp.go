// Package podhttp reads a path of a pod's port through the API server's
// port-forward (pods/portforward): the API server authorizes the
// forward with the caller's own credentials, and the request carries a
// short-lived token of the ServiceAccount ViewerAccount of the pod's
// namespace, minted with the caller's rights, which the agent and the
// fabric review (TokenReview, SubjectAccessReview) like any other. The
// caller's own credential never reaches the pod.
package podhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// maxBody bounds what is read: a node's trace report or an agent's
// metrics are far smaller.
const maxBody = 32 << 20

// ViewerAccount is the ServiceAccount, in the namespace of the pods
// read, bound to ClusterRole flotilla-viewer (deploy/rbac.yaml), whose
// token a request carries.
const ViewerAccount = "flotilla-viewer"

// tokenLifetime is the shortest the API server issues.
const tokenLifetime = 10 * time.Minute

// readyWait bounds how long a port-forward may take to be ready: the
// API server and the pod's kubelet each answer an upgrade first, and on
// a loaded cluster a forward that never comes would otherwise hold the
// command until its caller gives up.
const readyWait = 30 * time.Second

// Forward is a port-forward to one port of a pod, with the viewer token
// its requests carry, for any number of GETs; Close ends it.
type Forward struct {
	ns, name string
	port     int
	local    uint16
	token    string
	tokenErr error
	stop     chan struct{}
}

// Get returns the body of GET path on port of pod ns/name; an answer
// other than 200 OK is a *StatusError, returned with the body.
func Get(ctx context.Context, cfg *rest.Config, ns, name string, port int, path string) ([]byte, error) {
	f, err := Open(ctx, cfg, ns, name, port)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Get(ctx, path)
}

// Open forwards a local port to port of pod ns/name and mints the viewer
// token (at once), and returns once the forward is ready, within
// readyWait.
func Open(ctx context.Context, cfg *rest.Config, ns, name string, port int) (*Forward, error) {
	kube, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	f := &Forward{ns: ns, name: name, port: port, stop: make(chan struct{})}
	// Health answers without a token: a caller who may not mint one
	// still reads it, and is told why when a path needs one.
	minted := make(chan struct{})
	go func() {
		defer close(minted)
		f.token, f.tokenErr = viewerToken(ctx, kube, ns, name)
	}()
	fail := func(err error) (*Forward, error) {
		close(f.stop)
		return nil, fmt.Errorf("port-forward to pod %s/%s port %d: %w", ns, name, port, err)
	}
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return fail(err)
	}
	url := kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, f.stop, ready, io.Discard, io.Discard)
	if err != nil {
		return fail(err)
	}
	failed := make(chan error, 1)
	go func() { failed <- fw.ForwardPorts() }()
	wait := time.NewTimer(readyWait)
	defer wait.Stop()
	select {
	case <-ready:
	case err := <-failed:
		if err == nil {
			err = errors.New("ended before it was ready")
		}
		return fail(err)
	case <-wait.C:
		return fail(fmt.Errorf("not ready after %v: the API server or the kubelet of the pod's node did not answer", readyWait))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		return fail(fmt.Errorf("no local port (%v)", err))
	}
	f.local = ports[0].Local
	<-minted
	return f, nil
}

// Close ends the forward.
func (f *Forward) Close() { close(f.stop) }

// Get returns the body of GET path through the forward; an answer other
// than 200 OK is a *StatusError, returned with the body.
func (f *Forward) Get(ctx context.Context, path string) ([]byte, error) {
	ns, name, port := f.ns, f.name, f.port
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", f.local, path), nil)
	if err != nil {
		return nil, err
	}
	if f.tokenErr == nil {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s of pod %s/%s port %d: %w", path, ns, name, port, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("GET %s of pod %s/%s port %d: %w", path, ns, name, port, err)
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("GET %s of pod %s/%s port %d: %s: %s", path, ns, name, port, resp.Status, body)
		if resp.StatusCode == http.StatusUnauthorized && f.tokenErr != nil {
			err = fmt.Errorf("GET %s of pod %s/%s port %d: %s, without a token: %w", path, ns, name, port, resp.Status, f.tokenErr)
		}
		return body, &StatusError{Status: resp.Status, Code: resp.StatusCode, Body: body, err: err}
	}
	return body, nil
}

// StatusError is an answer other than 200 OK; Get returns its body too.
// /readyz answers 503 with the checks that fail.
type StatusError struct {
	Status string
	Code   int
	Body   []byte
	err    error
}

func (e *StatusError) Error() string { return e.err.Error() }

// viewerToken mints a token of ViewerAccount in ns, valid for
// tokenLifetime, to read pod ns/pod with. It is bound to no object: the
// API server binds a token only to a pod that runs as its account, and
// the agent's pod runs as the agent's.
func viewerToken(ctx context.Context, kube kubeclient.Interface, ns, pod string) (string, error) {
	seconds := int64(tokenLifetime / time.Second)
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, ViewerAccount, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &seconds,
	}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token of ServiceAccount %s/%s to read pod %s (ask an admin for create on serviceaccounts/token named %s in %s): %w",
			ns, ViewerAccount, pod, ViewerAccount, ns, err)
	}
	return tr.Status.Token, nil
}

// Package podhttp reads a path of a pod's port through the API server's
// port-forward (pods/portforward): the request is authorized by the API
// server with the caller's own credentials and arrives on the pod's
// loopback, where the agent and the fabric serve it without a token.
package podhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
)

// maxBody bounds what is read: a node's trace report or an agent's
// metrics are far smaller.
const maxBody = 32 << 20

// Get returns the body of GET path on port of pod ns/name; an answer
// other than 200 OK is a *StatusError, returned with the body.
func Get(ctx context.Context, cfg *rest.Config, ns, name string, port int, path string) ([]byte, error) {
	kube, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ns, name, err)
	}
	url := kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s/%s: %w", ns, name, err)
	}
	failed := make(chan error, 1)
	go func() { failed <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-failed:
		if err == nil {
			err = errors.New("ended before it was ready")
		}
		return nil, fmt.Errorf("port-forward to pod %s/%s port %d: %w", ns, name, port, err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		return nil, fmt.Errorf("port-forward to pod %s/%s port %d: no local port (%v)", ns, name, port, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", ports[0].Local, path), nil)
	if err != nil {
		return nil, err
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
		return body, &StatusError{Status: resp.Status, Code: resp.StatusCode, Body: body,
			err: fmt.Errorf("GET %s of pod %s/%s port %d: %s: %s", path, ns, name, port, resp.Status, body)}
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

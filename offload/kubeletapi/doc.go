// Package kubeletapi serves the kubelet API of the virtual nodes: the API
// server calls it for logs, exec, attach and port-forward of offloaded
// pods, authenticated by client certificate and authorized by
// SubjectAccessReview, and it forwards each request to the pod on its
// provider with the credential the provider granted.
package kubeletapi

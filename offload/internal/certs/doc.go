// Package certs is the certificate authority of the agent's two servers
// that the API server calls (the placement webhook and the virtual nodes'
// kubelet API): CAs kept in a Secret, rotated with an overlap, and the
// serving certificates they sign.
package certs

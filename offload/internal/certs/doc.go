// Package certs is the certificate authority of the agent's two servers
// that the API server calls (the placement webhook and the virtual nodes'
// kubelet API): CAs kept in a Secret, rotated with an overlap, the
// serving certificates they sign, and the loop that serves HTTPS with
// them (Server).
package certs

package harness

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// egressProxy carries the API server's connections to kubelets and pods
// (logs, exec, port-forward, the proxy subresources), and to webhooks it
// calls by URL (an agent's admission webhook), into the network
// namespace that holds the address: a node's, or one a test routed with
// ReachInto. The API server runs in the host's namespace on loopback and
// reaches nothing inside another namespace by itself; its egress
// selector ("cluster" for kubelets and pods, "controlplane" for webhooks
// called by URL) sends those connections here as HTTP CONNECT requests
// over a Unix socket. Addresses nobody routed are dialled from the host,
// as without the proxy (a webhook served by the test process on
// loopback, say).
type egressProxy struct {
	socket string
	l      net.Listener

	mu     sync.Mutex
	routes []egressRoute
}

type egressRoute struct {
	prefix netip.Prefix
	netns  *Netns
}

func (e *Env) newEgressProxy(dir string) (*egressProxy, error) {
	p := &egressProxy{socket: filepath.Join(dir, "egress.sock")}
	os.Remove(p.socket)
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	p.l = l
	e.t.Cleanup(func() { l.Close() })
	go p.serve()
	return p, nil
}

// configFile writes the API server's EgressSelectorConfiguration.
func (p *egressProxy) configFile(dir string) (string, error) {
	path := filepath.Join(dir, "egress-selector.yaml")
	cfg := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %[1]s
- name: controlplane
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %[1]s
`, p.socket)
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// route sends connections to addresses in prefix into netns.
func (p *egressProxy) route(prefix netip.Prefix, n *Netns) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.routes = append(p.routes, egressRoute{prefix, n})
}

// unroute forgets every route into n.
func (p *egressProxy) unroute(n *Netns) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.routes[:0]
	for _, r := range p.routes {
		if r.netns != n {
			kept = append(kept, r)
		}
	}
	p.routes = kept
}

func (p *egressProxy) netnsFor(addr netip.Addr) *Netns {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best *egressRoute
	for i, r := range p.routes {
		if r.prefix.Contains(addr) && (best == nil || r.prefix.Bits() > best.prefix.Bits()) {
			best = &p.routes[i]
		}
	}
	if best == nil {
		return nil
	}
	return best.netns
}

func (p *egressProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *egressProxy) handle(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\nonly CONNECT\r\n")
		return
	}
	target := req.RequestURI
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out net.Conn
	ap, err := netip.ParseAddrPort(target)
	if n := p.netnsFor(ap.Addr()); err == nil && n != nil {
		out, err = n.DialContext(ctx, "tcp", target)
	} else {
		var d net.Dialer
		out, err = d.DialContext(ctx, "tcp", target)
	}
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n%v\r\n", err)
		return
	}
	defer out.Close()
	if _, err := fmt.Fprintf(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { br.WriteTo(out); closeWrite(out); done <- struct{}{} }()
	go func() { bufio.NewReader(out).WriteTo(c); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

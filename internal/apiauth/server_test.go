package apiauth_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/flotilla-io/flotilla/internal/apiauth"
)

// A metrics port closes a connection a client keeps open after its
// answer: clients that open one per scrape and never close it hold
// nothing in the agent for long. The answer is read first, so the
// connection was served before it is found closed.
func TestServerClosesIdleConnections(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := apiauth.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})

	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "ok\n" || resp.Close {
		t.Fatalf("answer: %q, %v, closed %v; want ok on a connection kept open", body, err, resp.Close)
	}
	// Nothing more is asked: the server closes the connection after
	// IdleTimeout (twice that allowed, for a loaded machine).
	conn.SetReadDeadline(time.Now().Add(2 * apiauth.IdleTimeout))
	if n, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read on the idle connection: %d bytes, %v; want it closed by the server (EOF)", n, err)
	}
}

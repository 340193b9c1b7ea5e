package certs

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Server serves HTTPS with the serving certificate of a CAStore and keeps
// that certificate current: the loop the placement webhook and the
// kubelet API share. Its owner says how the certificates are loaded and
// renewed (and how their CAs are published); the Server retries both
// with backoff, listens once the first certificate is issued, and stops
// in order.
type Server struct {
	// Name names the server in errors ("placement webhook").
	Name string
	// Addr is where it listens (host:port).
	Addr string
	// Store issues the certificate it presents, and says when it is due
	// for renewal.
	Store *CAStore
	// Start loads the CAs and issues the first serving certificate; it
	// is tried again with backoff until it succeeds, before the server
	// listens.
	Start func(ctx context.Context) error
	// Renew brings the certificates, and whatever publishes their CAs, in
	// line with now: called once the server listens, when Store is due,
	// when Changed says, and with backoff after it failed.
	Renew func(ctx context.Context, now time.Time) error
	// Changed asks for a Renew (what the certificate names, or what
	// publishes a CA, changed); nil for never.
	Changed <-chan struct{}
	// Listening is told once the server listens, for the owner's log;
	// nil is fine.
	Listening func()
	// Grace is how long a stop waits for the requests under way; 0
	// closes every connection at once.
	Grace time.Duration
	// Closed is called once the server is closed, before Serve waits
	// for it: it ends what http.Server does not wait for (hijacked
	// connections). nil is fine.
	Closed func()

	serving atomic.Bool
}

// retry is the backoff of a failed Start or Renew: from a second,
// doubling, to a minute.
func retry() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: math.MaxInt}
}

// Serve issues the first certificate, serves srv on Addr with it (its
// TLSConfig's GetCertificate is Store's) and renews it until ctx ends
// (it returns nil) or the server fails; it returns once the server's
// goroutine has.
func (s *Server) Serve(ctx context.Context, srv *http.Server) error {
	if !s.start(ctx) {
		return nil
	}
	l, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("%s: listen on %s: %w", s.Name, s.Addr, err)
	}
	if srv.TLSConfig == nil {
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	srv.TLSConfig.GetCertificate = s.Store.Certificate
	served, done := make(chan error, 1), make(chan struct{})
	// Serving from here on: the listener queues connections already, and
	// a client answered before the goroutine below got this far must not
	// find the server not ready.
	s.serving.Store(true)
	go func() {
		defer close(done)
		served <- srv.ServeTLS(l, "", "")
	}()
	defer s.stop(srv, done)
	if s.Listening != nil {
		s.Listening()
	}
	return s.renew(ctx, served)
}

// start runs Start until it succeeds; false when ctx ended first.
func (s *Server) start(ctx context.Context) bool {
	backoff := retry()
	for {
		if s.Start(ctx) == nil {
			return true
		}
		t := time.NewTimer(backoff.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// renew runs Renew when due until ctx ends or the server stops.
func (s *Server) renew(ctx context.Context, served <-chan error) error {
	backoff := retry()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-served:
			return fmt.Errorf("%s: serve on %s: %w", s.Name, s.Addr, err)
		case <-timer.C:
		case <-s.Changed:
		}
		var after time.Duration
		if err := s.Renew(ctx, time.Now()); err != nil {
			after = backoff.Step()
		} else {
			backoff = retry()
			after = time.Until(s.Store.WakeAt())
		}
		timer.Reset(after)
	}
}

// stop closes the server (within Grace), lets the owner end what it
// does not wait for, and waits for the server's goroutine (done).
func (s *Server) stop(srv *http.Server, done <-chan struct{}) {
	s.serving.Store(false)
	if s.Grace > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), s.Grace)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
	} else {
		srv.Close()
	}
	if s.Closed != nil {
		s.Closed()
	}
	<-done
}

// Ready says whether the server listens with a valid certificate, for
// the agent's /readyz.
func (s *Server) Ready() error {
	if !s.serving.Load() {
		return fmt.Errorf("%s: not serving yet", s.Name)
	}
	return s.Store.Ready(time.Now())
}

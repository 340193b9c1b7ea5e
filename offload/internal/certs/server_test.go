package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/flotilla-io/flotilla/internal/eventually"
)

// A server whose first certificate fails to load retries, then serves
// HTTPS with a certificate of its store's CA, renews it when told, and
// stops when its context ends.
func TestServerServesWithItsStoresCertificate(t *testing.T) {
	store := NewCAStore(CAStoreConfig{
		Kube: fake.NewClientset(), Namespace: "flotilla", Secret: "test-ca", Name: "test server", Component: "test",
		Lifetimes: CertLifetimes{CA: 24 * time.Hour, Serving: time.Hour, Publish: time.Minute}, Log: slog.New(slog.DiscardHandler),
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var starts, renewals atomic.Int32
	changed := make(chan struct{}, 1)
	s := &Server{
		Name: "test server", Addr: addr, Store: store, Changed: changed,
		Start: func(ctx context.Context) error {
			if starts.Add(1) == 1 {
				return errors.New("the API server is not there yet")
			}
			if err := store.Load(ctx); err != nil {
				return err
			}
			store.SetHosts([]string{"127.0.0.1"})
			_, err := store.Sync(ctx, time.Now())
			return err
		},
		Renew: func(ctx context.Context, now time.Time) error {
			renewals.Add(1)
			_, err := store.Sync(ctx, now)
			return err
		},
	}
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "not serving") {
		t.Errorf("Ready before Serve: %v, want not serving", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Serve(ctx, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "hello")
		})})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	roots := x509.NewCertPool()
	eventually.Within(t, 10*time.Second, "the server answering over TLS with its store's certificate", func() error {
		roots.AppendCertsFromPEM(store.Bundle())
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		resp, err := c.Get("https://" + addr + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "hello" {
			return errors.New("answered " + string(body))
		}
		return nil
	})
	if err := s.Ready(); err != nil {
		t.Errorf("Ready while serving: %v", err)
	}
	if n := starts.Load(); n != 2 {
		t.Errorf("Start called %d times, want 2 (one failure, one retry)", n)
	}
	// A renewal once it listens, and one more when told.
	eventually.Within(t, 5*time.Second, "the first renewal", func() error {
		if renewals.Load() < 1 {
			return errors.New("none yet")
		}
		return nil
	})
	before := renewals.Load()
	changed <- struct{}{}
	eventually.Within(t, 5*time.Second, "a renewal when told of a change", func() error {
		if renewals.Load() == before {
			return errors.New("none yet")
		}
		return nil
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v, want nil once its context ended", err)
		}
		done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	if err := s.Ready(); err == nil {
		t.Error("Ready after Serve returned: nil, want not serving")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("the server still accepts connections after Serve returned")
	}
}

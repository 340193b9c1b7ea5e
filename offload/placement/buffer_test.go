package placement

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/test/harness"
)

// Reviews waiting for a slot hold little of their bodies in memory over
// HTTP/2 too: 100 reviews of 4 MiB (the most a review may be) sent over 50
// connections at once, while every slot is taken, are each refused (429)
// and grow the heap in use (this process's: the webhook's server and the
// clients) by less than waitingHeapLimit. With HTTP/2's default buffers
// (1 MiB per connection) the same grew it by about 96 MiB.
func TestPlacementWebhookBuffersLittleOfWaitingReviews(t *testing.T) {
	const (
		requests, workers, size = 100, 50, maxReviewBytes
		waitingHeapLimit        = 32 << 20
	)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := NewWebhook(WebhookConfig{
		Config: &rest.Config{Host: "https://127.0.0.1:1"}, Address: mustAddr("127.0.0.1"), AgentNamespace: "flotilla-system",
		AnyClient: true, Logger: logger, Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for range maxConcurrentReviews {
		w.slots <- struct{}{}
	}
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = newHTTPServer(w, nil, logger)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	runtime.GC()
	base := heapBytes()
	peak := harness.SamplePeak(5*time.Millisecond, func() (uint64, error) { return heapBytes(), nil })
	var busy, h2 atomic.Int64
	harness.Flood(requests, workers, func() {
		// A connection of its own per review.
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodPost, srv.URL+placementPath, &sizedBody{left: size})
		if err != nil {
			t.Error(err)
			return
		}
		req.ContentLength = size
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			busy.Add(1)
		}
		if resp.ProtoMajor == 2 {
			h2.Add(1)
		}
	})
	grew := int64(peak.Stop()) - int64(base)
	t.Logf("%d of %d reviews refused busy, %d over HTTP/2; heap in use grew by at most %.1f MiB", busy.Load(), requests, h2.Load(), float64(grew)/(1<<20))
	if busy.Load() != requests || h2.Load() != requests {
		t.Errorf("%d of %d reviews refused busy (429), %d over HTTP/2; want every one", busy.Load(), requests, h2.Load())
	}
	if grew > waitingHeapLimit {
		t.Errorf("heap in use grew by %d MiB while reviews waited, at most %d MiB", grew>>20, waitingHeapLimit>>20)
	}
}

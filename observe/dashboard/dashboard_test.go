package dashboard

import (
	"context"
	"flag"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
	"github.com/flotilla-io/flotilla/deploy"
	"github.com/flotilla-io/flotilla/observe/graph"
	"github.com/flotilla-io/flotilla/peering"
	"github.com/flotilla-io/flotilla/peering/peerapi"
	"github.com/flotilla-io/flotilla/test/harness"
)

var update = flag.Bool("update", false, "write the dashboard's screenshot to docs/images/dashboard.png")

const (
	alphaID = "1a1a1a1a-0000-4000-8000-000000000001"
	betaID  = "2b2b2b2b-0000-4000-8000-000000000002"
	gammaID = "3c3c3c3c-0000-4000-8000-000000000003"
)

// noSpecs ignores the specs the Peer informer reports; the page only
// reads the cache.
type noSpecs struct{}

func (noSpecs) SpecChanged(string, peering.Spec) {}
func (noSpecs) SpecDeleted(string)               {}

// peersOfAlpha is the cluster alpha's view: beta connected, its pods
// remapped, hosting alpha; gamma degraded.
func peersOfAlpha() []v1alpha1.Peer {
	now := metav1.Now()
	hs := metav1.NewTime(now.Add(-10 * time.Minute))
	return []v1alpha1.Peer{
		{ObjectMeta: metav1.ObjectMeta{Name: betaID}, Status: v1alpha1.PeerStatus{
			ClusterName: "beta", Phase: v1alpha1.PhaseConnected, Endpoint: "192.0.2.2:51820", LastHandshake: &now,
			TheirNetworks: []v1alpha1.NetworkView{{Range: "10.1.0.0/16", As: "10.201.0.0/16"}},
			MyNetworks:    []v1alpha1.NetworkView{{Range: "10.1.0.0/16", As: "10.101.0.0/16"}},
			Offloading:    &v1alpha1.OffloadingStatus{Received: &v1alpha1.GrantStatus{Namespace: "flotilla-tenant-alpha"}},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: gammaID}, Status: v1alpha1.PeerStatus{
			ClusterName: "gamma", Phase: v1alpha1.PhaseDegraded, Endpoint: "192.0.2.3:51820", LastHandshake: &hs,
			TheirNetworks: []v1alpha1.NetworkView{{Range: "10.3.0.0/16", As: "10.3.0.0/16"}},
			MyNetworks:    []v1alpha1.NetworkView{{Range: "10.1.0.0/16", As: "10.1.0.0/16"}},
		}},
	}
}

// tunnelCounters stands for the agent's tunnel collector: beta's bytes.
type tunnelCounters struct{ rx, tx *prometheus.Desc }

func (c tunnelCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.rx; ch <- c.tx }
func (c tunnelCounters) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.rx, prometheus.CounterValue, 1536, betaID)
	ch <- prometheus.MustNewConstMetric(c.tx, prometheus.CounterValue, 3<<20, betaID)
}

// dashboardEnv is a real API server holding alpha's Peers, the agent's
// Peer informer on it, and the dashboard serving from that cache.
type dashboardEnv struct {
	writer client.Client
	reader client.Reader
	url    string
	// gate, when set, runs before each page load is served.
	gate atomic.Pointer[func(r *http.Request)]
}

func newDashboardEnv(t *testing.T) *dashboardEnv {
	harness.Require(t, harness.NeedsControlPlane...)
	harness.Require(t, harness.Chromium)
	env := harness.New(t)
	cp := env.ControlPlane("alpha", harness.ControlPlaneOptions{})
	ctx := t.Context()
	if err := harness.ApplyCRDs(ctx, cp.Config, deploy.CRDs, "crds/*.yaml"); err != nil {
		t.Fatal(err)
	}
	w, err := client.New(cp.Config, client.Options{Scheme: peerapi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peersOfAlpha() {
		status := p.Status
		if err := w.Create(ctx, &p); err != nil {
			t.Fatal(err)
		}
		p.Status = status
		if err := w.Status().Update(ctx, &p); err != nil {
			t.Fatal(err)
		}
	}
	// alpha offloads namespace shop to beta.
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	no := &v1alpha1.NamespaceOffload{ObjectMeta: metav1.ObjectMeta{Name: "offload", Namespace: "shop"}}
	if err := w.Create(ctx, no); err != nil {
		t.Fatal(err)
	}
	no.Status = v1alpha1.NamespaceOffloadStatus{Phase: v1alpha1.OffloadReady, Clusters: []v1alpha1.ClusterOffload{{ClusterID: betaID, ClusterName: "beta", RemoteNamespace: "shop-1a1a1a"}}}
	if err := w.Status().Update(ctx, no); err != nil {
		t.Fatal(err)
	}
	objects, err := peerapi.New(cp.Config, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- objects.Run(runCtx, noSpecs{}) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Peer informer: %v", err)
		}
	})
	select {
	case <-objects.Synced():
	case err := <-done:
		t.Fatalf("Peer informer: %v", err)
	}
	// Namespace offloading's cache, as the agent's mirror.Consumer keeps.
	offloads, err := cache.New(cp.Config, cache.Options{Scheme: peerapi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := offloads.GetInformer(ctx, &v1alpha1.NamespaceOffload{}); err != nil {
		t.Fatal(err)
	}
	cacheCtx, stopCache := context.WithCancel(context.Background())
	cacheDone := make(chan error, 1)
	go func() { cacheDone <- offloads.Start(cacheCtx) }()
	t.Cleanup(func() {
		stopCache()
		if err := <-cacheDone; err != nil {
			t.Errorf("NamespaceOffload cache: %v", err)
		}
	})
	if !offloads.WaitForCacheSync(ctx) {
		t.Fatal("the NamespaceOffload cache did not sync")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(tunnelCounters{
		rx: prometheus.NewDesc("flotilla_peer_receive_bytes_total", "rx", []string{"peer"}, nil),
		tx: prometheus.NewDesc("flotilla_peer_transmit_bytes_total", "tx", []string{"peer"}, nil),
	})
	e := &dashboardEnv{writer: w, reader: objects.Reader()}
	self := func() graph.Self { return graph.Self{ID: alphaID, Name: "alpha", Nodes: 3} }
	h := New(PeersSource(Readers{Peers: e.reader, Offloads: offloads, Metrics: reg}, self), nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g := e.gate.Load(); g != nil && r.URL.Path == "/" {
			(*g)(r)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL + "/"
	return e
}

// The page in a real browser, on one API server and its informer: with
// scripts off, as a screenshot, and refreshing itself (last: it changes
// a Peer).
func TestDashboardInChromium(t *testing.T) {
	e := newDashboardEnv(t)
	t.Run("without JavaScript", e.withoutJavaScript)
	t.Run("screenshot", e.screenshot)
	t.Run("refreshes live", e.refreshesLive)
}

// The page as a browser without JavaScript shows it: everything is in
// the server's HTML.
func (e *dashboardEnv) withoutJavaScript(t *testing.T) {
	dom := domWithoutJavaScript(t, e.url)
	for _, want := range []string{
		"Flotilla: alpha", alphaID,
		// The table: each peer, its phase, its traffic and views.
		`<td>beta</td><td class="id">` + betaID + `</td><td class="phase-Connected">Connected</td><td>192.0.2.2:51820</td>`,
		`<td>gamma</td><td class="id">` + gammaID + `</td><td class="phase-Degraded">Degraded</td>`,
		"rx 1.5 KiB, tx 3.0 MiB", "10.1.0.0/16→10.201.0.0/16", "flotilla-tenant-alpha",
		// The namespaces alpha offloads, in the list and in its box.
		"<li>namespace shop offloaded to beta (Ready)</li>", "ns shop → beta",
		// The graph: every cluster and link drawn.
		`data-id="` + betaID + `"`, `data-id="` + gammaID + `"`, `data-a="` + alphaID + `" data-b="` + betaID + `"`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page has no %s:\n%s", want, dom)
		}
	}
}

// A screenshot of the page, 1280x900, with the graph drawn: not blank.
func (e *dashboardEnv) screenshot(t *testing.T) {
	shot := filepath.Join(t.TempDir(), "dashboard.png")
	chromium(t, "--screenshot="+shot, "--window-size=1280,900", "--hide-scrollbars", e.url)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("the screenshot is no PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 900 {
		t.Errorf("screenshot %dx%d, want 1280x900", b.Dx(), b.Dy())
	}
	// The phases' colours are on it: the links and the table.
	colours := map[[3]uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 2 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	for name, c := range map[string][3]uint32{"Connected green": {0x2e, 0x7d, 0x32}, "Degraded orange": {0xef, 0x6c, 0x00}} {
		if !colours[c] {
			t.Errorf("no %s on the screenshot", name)
		}
	}
	if *update {
		data, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "images", "dashboard.png"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// With JavaScript the page refreshes itself: a Peer changed after the
// first load shows without a reload.
func (e *dashboardEnv) refreshesLive(t *testing.T) {
	var loads atomic.Int32
	gate := func(r *http.Request) {
		switch loads.Add(1) {
		case 1:
			// The first load shows beta Connected; beta then fails.
			go e.setPhase(t, betaID, v1alpha1.PhaseUnreachable)
		case 2:
			// The refresh is served once the informer has seen it.
			e.waitPhase(r.Context(), betaID, v1alpha1.PhaseUnreachable)
		}
	}
	e.gate.Store(&gate)
	defer e.gate.Store(nil)
	// Virtual time runs the page's timer at once; network waits pause it.
	dom := string(chromium(t, "--dump-dom", "--virtual-time-budget=30000", e.url))
	if loads.Load() < 2 {
		t.Fatalf("the page was loaded %d times, want a refresh after the first load:\n%s", loads.Load(), dom)
	}
	want := `<td>beta</td><td class="id">` + betaID + `</td><td class="phase-Unreachable">Unreachable</td>`
	if !strings.Contains(dom, want) {
		t.Errorf("after the refresh the page has no %s:\n%s", want, dom)
	}
}

func (e *dashboardEnv) setPhase(t *testing.T, id string, phase v1alpha1.Phase) {
	var p v1alpha1.Peer
	ctx := context.Background()
	if err := e.writer.Get(ctx, client.ObjectKey{Name: id}, &p); err != nil {
		t.Error(err)
		return
	}
	p.Status.Phase = phase
	if err := e.writer.Status().Update(ctx, &p); err != nil {
		t.Error(err)
	}
}

func (e *dashboardEnv) waitPhase(ctx context.Context, id string, phase v1alpha1.Phase) {
	_ = wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var p v1alpha1.Peer
		if err := e.reader.Get(ctx, client.ObjectKey{Name: id}, &p); err != nil {
			return false, nil
		}
		return p.Status.Phase == phase, nil
	})
}

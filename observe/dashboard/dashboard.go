// Package dashboard is the agent's page at /: the federation drawn as
// the graph command draws it, and the table of this cluster's Peers,
// rendered on the server so that it reads with JavaScript off. A small
// inline script refreshes it in place; without JavaScript a meta refresh
// reloads it. No external assets, no build step.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"html/template"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flotilla-io/flotilla/observe/graph"
)

// Source is what the page shows: this cluster's report. It should read
// from caches: the page asks on every load and every refresh.
type Source func(ctx context.Context) (graph.Report, error)

// RefreshSeconds is how often the page refreshes itself.
const RefreshSeconds = 5

//go:embed page.html
var pageFS embed.FS

// page is parsed at the first request, not at the agent's start.
var page = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("page.html").Funcs(template.FuncMap{
		"join": strings.Join,
	}).ParseFS(pageFS, "page.html"))
})

// Handler serves the page at /, and the same graph at /graph.svg and
// /graph.json for scripts and bookmarks.
type Handler struct {
	src Source
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	lastErr string // logged once per change, not per page load
}

// New serves src's report; log receives the errors of src.
func New(src Source, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{src: src, log: log, now: time.Now}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "only GET", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/", "/graph.svg", "/graph.json":
	default:
		http.NotFound(w, r)
		return
	}
	now := h.now()
	report, err := h.src(r.Context())
	h.noteError(err)
	g := graph.Build([]graph.Report{report}, now)
	var body bytes.Buffer
	switch r.URL.Path {
	case "/graph.svg":
		w.Header().Set("Content-Type", "image/svg+xml")
		_ = graph.WriteSVG(&body, g)
	case "/graph.json":
		w.Header().Set("Content-Type", "application/json")
		_ = graph.WriteJSON(&body, g)
	default:
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// Nothing leaves the page: no external assets, no other origin.
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src 'self'")
		if terr := page().Execute(&body, view(report, g, err, now)); terr != nil {
			h.log.Error("dashboard: render", "err", terr)
			http.Error(w, "render the dashboard: "+terr.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body.Bytes())
}

// noteError logs err when it differs from the last one.
func (h *Handler) noteError(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	h.mu.Lock()
	changed := msg != h.lastErr
	h.lastErr = msg
	h.mu.Unlock()
	switch {
	case changed && err != nil:
		h.log.Warn("dashboard: the page is incomplete", "err", err)
	case changed:
		h.log.Info("dashboard: the page is complete again")
	}
}

// pageData is what the template reads.
type pageData struct {
	Self     graph.Cluster
	Now      string
	Error    string
	SVG      template.HTML
	Peers    []row
	Phases   []phaseCount
	Refresh  int
	Offloads []string
}

type phaseCount struct {
	Phase string
	Count int
}

// row is one Peer in the table.
type row struct {
	Name, ID, Phase, Endpoint, Handshake, Traffic string
	Theirs, Mine                                  string
	Hosting, Offload                              string
	Spec                                          string
}

func view(r graph.Report, g graph.Graph, err error, now time.Time) pageData {
	d := pageData{Now: now.UTC().Format(time.RFC3339), Refresh: RefreshSeconds}
	if err != nil {
		d.Error = err.Error()
	}
	for _, c := range g.Clusters {
		if c.Reported {
			d.Self = c
			for _, o := range c.Offloads {
				d.Offloads = append(d.Offloads, g.OffloadLine(o))
			}
		}
	}
	// The SVG escapes every name it draws (graph.SVG).
	d.SVG = template.HTML(graph.SVG(g))
	counts := map[string]int{}
	for _, l := range g.Links {
		v := l.AB
		if l.A != d.Self.ID {
			v = l.BA
		}
		if v == nil {
			continue
		}
		other := l.B
		if other == d.Self.ID {
			other = l.A
		}
		c, _ := g.Cluster(other)
		d.Peers = append(d.Peers, rowOf(c, v))
		counts[dash(v.Phase)]++
	}
	slices.SortFunc(d.Peers, func(a, b row) int { return strings.Compare(a.Name+a.ID, b.Name+b.ID) })
	for p, n := range counts {
		d.Phases = append(d.Phases, phaseCount{p, n})
	}
	slices.SortFunc(d.Phases, func(a, b phaseCount) int { return strings.Compare(a.Phase, b.Phase) })
	return d
}

func rowOf(c graph.Cluster, v *graph.View) row {
	r := row{
		Name: c.Name, ID: c.ID, Phase: dash(v.Phase), Endpoint: dash(v.Endpoint), Handshake: v.Handshake(),
		Traffic: dash(v.Counters()), Theirs: dash(graph.Ranges(v.Theirs)), Mine: dash(graph.Ranges(v.Mine)),
		Hosting: "-", Offload: "-",
	}
	if g := v.Hosts; g != nil {
		r.Hosting = strings.TrimSpace(g.Namespace + " " + g.State)
	}
	if g := v.OffloadsTo; g != nil {
		r.Offload = strings.TrimSpace(g.Namespace + " " + g.State)
	}
	var spec []string
	for _, s := range []struct{ k, v string }{{"networking", v.Networking}, {"offloading", v.Offloading}, {"traffic", v.Traffic}} {
		if s.v != "" {
			spec = append(spec, s.k+"="+s.v)
		}
	}
	r.Spec = dash(strings.Join(spec, " "))
	return r
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

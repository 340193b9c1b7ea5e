package mcs

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-io/flotilla/identity"
)

// A cluster's exports travel as a snapshot of all of them, signed by the
// exporter, in pages that fit a gossip message (docs/services.md):
//
//	message = format (1 byte) || page (JSON) || Ed25519 signature
//	signed  = signingDomain || format || page
//
// The signature names the exporter: the gossip does not say who sent a
// message, and only the holder of a cluster's identity key can speak for
// its exports.
const (
	wireFormat    byte = 1
	signingDomain      = "flotilla.io/mcs/v1 exports\x00"
	// MaxPages bounds a snapshot: 1024 pages of 64 KiB are far more than
	// any cluster's exports, and a receiver holds no more for one sender.
	MaxPages = 1024
)

// Export is one exported Service as its exporter sees it.
type Export struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Type is ClusterSetIP or Headless (the KEP's ServiceImport types).
	Type  string `json:"type"`
	Ports []Port `json:"ports,omitempty"`
	// Created is the ServiceExport's creation time: the oldest export
	// wins a conflict (KEP-1645).
	Created         time.Time `json:"created"`
	SessionAffinity string    `json:"sessionAffinity,omitempty"`
	// AffinityTimeout is ClientIP affinity's timeout in seconds; 0: none.
	AffinityTimeout int32 `json:"affinityTimeout,omitempty"`
	// InternalTrafficPolicy and TrafficDistribution are the Service's,
	// as Kubernetes spells them (empty: not set). Receivers that predate
	// them ignore them.
	InternalTrafficPolicy string `json:"internalTrafficPolicy,omitempty"`
	TrafficDistribution   string `json:"trafficDistribution,omitempty"`
	// Labels and Annotations are the ServiceExport's exportedLabels and
	// exportedAnnotations (exportedMeta: valid, outside the reserved
	// domains, bounded); the importer puts them on its ServiceImport.
	// Receivers that predate them ignore them.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Slices are the Service's EndpointSlices, addresses in the
	// exporter's own terms.
	Slices []Slice `json:"slices,omitempty"`
}

// Key is "namespace/name".
func (e Export) Key() string { return e.Namespace + "/" + e.Name }

// Port is a Service port (on an export) or an endpoint port (on a slice:
// the port the pods listen on).
type Port struct {
	Name        string `json:"name,omitempty"`
	Protocol    string `json:"protocol"`
	AppProtocol string `json:"appProtocol,omitempty"`
	Port        int32  `json:"port"`
}

// Slice is one EndpointSlice of an exported Service.
type Slice struct {
	Ports     []Port     `json:"ports,omitempty"`
	Endpoints []Endpoint `json:"endpoints,omitempty"`
}

// Endpoint is one endpoint of a slice.
type Endpoint struct {
	Addresses []netip.Addr `json:"addresses"`
	Ready     bool         `json:"ready,omitempty"`
	Serving   bool         `json:"serving,omitempty"`
	Hostname  string       `json:"hostname,omitempty"`
}

// Snapshot is all of one cluster's exports at one serial.
type Snapshot struct {
	Cluster string
	// Serial grows with every change and across restarts.
	Serial  uint64
	Exports []Export
}

// page is one message of a snapshot.
type page struct {
	Cluster string   `json:"cluster"`
	Serial  uint64   `json:"serial"`
	Page    int      `json:"page"`
	Pages   int      `json:"pages"`
	Exports []Export `json:"exports"`
}

// Encode signs s as id in messages of at most maxLen bytes each. An
// export too large for one message is split by its endpoints over
// several; the receiver joins them (Inbox).
func Encode(id identity.Identity, s Snapshot, maxLen int) ([][]byte, error) {
	budget := maxLen - 1 - ed25519.SignatureSize - pageOverhead(s)
	if budget < 1024 {
		return nil, fmt.Errorf("encode exports: messages of %d bytes leave no room for exports", maxLen)
	}
	var parts []Export
	for _, e := range s.Exports {
		split, err := splitExport(e, budget)
		if err != nil {
			return nil, err
		}
		parts = append(parts, split...)
	}
	var pages [][]Export
	var cur []Export
	size := 0
	for _, e := range parts {
		n := jsonLen(e) + 1
		if len(cur) > 0 && size+n > budget {
			pages = append(pages, cur)
			cur, size = nil, 0
		}
		cur = append(cur, e)
		size += n
	}
	if len(cur) > 0 || len(pages) == 0 {
		pages = append(pages, cur)
	}
	if len(pages) > MaxPages {
		return nil, fmt.Errorf("encode exports: %d pages, at most %d", len(pages), MaxPages)
	}
	out := make([][]byte, 0, len(pages))
	for i, exports := range pages {
		if exports == nil {
			exports = []Export{}
		}
		payload, err := json.Marshal(page{Cluster: s.Cluster, Serial: s.Serial, Page: i, Pages: len(pages), Exports: exports})
		if err != nil {
			return nil, fmt.Errorf("encode exports: %w", err)
		}
		msg := append([]byte{wireFormat}, payload...)
		msg = append(msg, id.Sign(signed(msg))...)
		if len(msg) > maxLen {
			return nil, fmt.Errorf("encode exports: page %d is %d bytes, at most %d", i, len(msg), maxLen)
		}
		out = append(out, msg)
	}
	return out, nil
}

// pageOverhead is what a page takes besides its exports, with room for
// the largest page numbers.
func pageOverhead(s Snapshot) int {
	return jsonLen(page{Cluster: s.Cluster, Serial: s.Serial, Page: MaxPages, Pages: MaxPages, Exports: []Export{}})
}

// splitExport halves e by its endpoints until each part fits budget.
func splitExport(e Export, budget int) ([]Export, error) {
	if jsonLen(e) <= budget {
		return []Export{e}, nil
	}
	if endpoints(e) <= 1 && len(e.Slices) <= 1 {
		return nil, fmt.Errorf("encode export %s: one endpoint does not fit a message", e.Key())
	}
	a, b := halve(e)
	pa, err := splitExport(a, budget)
	if err != nil {
		return nil, err
	}
	pb, err := splitExport(b, budget)
	if err != nil {
		return nil, err
	}
	return append(pa, pb...), nil
}

// halve gives each part half of e's endpoints, keeping their slices; with
// fewer than two endpoints, half of its slices.
func halve(e Export) (a, b Export) {
	a, b = e, e
	a.Slices, b.Slices = nil, nil
	total := endpoints(e)
	if total < 2 {
		n := len(e.Slices) / 2
		a.Slices, b.Slices = e.Slices[:n], e.Slices[n:]
		return a, b
	}
	half, seen := total/2, 0
	for _, s := range e.Slices {
		n := len(s.Endpoints)
		switch {
		case seen+n <= half:
			a.Slices = append(a.Slices, s)
		case seen >= half:
			b.Slices = append(b.Slices, s)
		default:
			cut := half - seen
			a.Slices = append(a.Slices, Slice{Ports: s.Ports, Endpoints: s.Endpoints[:cut]})
			b.Slices = append(b.Slices, Slice{Ports: s.Ports, Endpoints: s.Endpoints[cut:]})
		}
		seen += n
	}
	return a, b
}

func endpoints(e Export) int {
	n := 0
	for _, s := range e.Slices {
		n += len(s.Endpoints)
	}
	return n
}

func jsonLen(v any) int {
	b, _ := json.Marshal(v)
	return len(b)
}

func signed(msg []byte) []byte {
	return append([]byte(signingDomain), msg...)
}

// Errors of Inbox.Receive, for callers that count why.
var (
	ErrMalformed = errors.New("malformed")
	ErrUnknown   = errors.New("not a known member")
	ErrReplay    = errors.New("serial not newer than one already applied")
)

// Page is a received page, verified.
type Page struct {
	Cluster     string
	Serial      uint64
	Page, Pages int
	Exports     []Export
}

// DecodePage parses msg, checks its content, and verifies its signature
// with key(cluster) for the cluster it claims to come from. It returns a
// clear error for anything else; it never panics on any input.
func DecodePage(msg []byte, key func(cluster string) (ed25519.PublicKey, bool)) (Page, error) {
	if len(msg) < 1+ed25519.SignatureSize+2 {
		return Page{}, fmt.Errorf("exports message of %d bytes: %w", len(msg), ErrMalformed)
	}
	if msg[0] != wireFormat {
		return Page{}, fmt.Errorf("exports message of format %d, want %d: %w", msg[0], wireFormat, ErrMalformed)
	}
	body, sig := msg[:len(msg)-ed25519.SignatureSize], msg[len(msg)-ed25519.SignatureSize:]
	var p page
	dec := json.NewDecoder(bytes.NewReader(body[1:]))
	if err := dec.Decode(&p); err != nil {
		return Page{}, fmt.Errorf("exports message: %v: %w", err, ErrMalformed)
	}
	if dec.More() {
		return Page{}, fmt.Errorf("exports message: data after the page: %w", ErrMalformed)
	}
	if err := identity.ValidateClusterID(p.Cluster); err != nil {
		return Page{}, fmt.Errorf("exports message: cluster: %v: %w", err, ErrMalformed)
	}
	pub, ok := key(p.Cluster)
	if !ok {
		return Page{}, fmt.Errorf("exports of %s: %w", p.Cluster, ErrUnknown)
	}
	if err := identity.Verify(p.Cluster, pub, signed(body), sig); err != nil {
		return Page{}, fmt.Errorf("exports of %s: %w", p.Cluster, err)
	}
	if err := p.validate(); err != nil {
		return Page{}, fmt.Errorf("exports of %s, serial %d: %v: %w", p.Cluster, p.Serial, err, ErrMalformed)
	}
	return Page{Cluster: p.Cluster, Serial: p.Serial, Page: p.Page, Pages: p.Pages, Exports: p.Exports}, nil
}

// validate checks what an importer relies on; the signature only says
// who wrote it, not that it is sane.
func (p page) validate() error {
	switch {
	case p.Serial == 0:
		return errors.New("serial 0")
	case p.Pages < 1 || p.Pages > MaxPages:
		return fmt.Errorf("%d pages, want 1 to %d", p.Pages, MaxPages)
	case p.Page < 0 || p.Page >= p.Pages:
		return fmt.Errorf("page %d of %d", p.Page, p.Pages)
	}
	for i, e := range p.Exports {
		if err := e.validate(); err != nil {
			return fmt.Errorf("export %d (%s): %w", i, e.Key(), err)
		}
	}
	return nil
}

func (e Export) validate() error {
	if errs := validation.IsDNS1123Label(e.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace: %s", errs[0])
	}
	if errs := validation.IsDNS1035Label(e.Name); len(errs) > 0 {
		return fmt.Errorf("name: %s", errs[0])
	}
	if e.Type != TypeClusterSetIP && e.Type != TypeHeadless {
		return fmt.Errorf("type %q, want %s or %s", e.Type, TypeClusterSetIP, TypeHeadless)
	}
	if e.Created.IsZero() {
		return errors.New("no creation time")
	}
	switch e.SessionAffinity {
	case "", "None", "ClientIP":
	default:
		return fmt.Errorf("session affinity %q", e.SessionAffinity)
	}
	if e.AffinityTimeout < 0 || e.AffinityTimeout > 86400 {
		return fmt.Errorf("affinity timeout %d s", e.AffinityTimeout)
	}
	switch e.InternalTrafficPolicy {
	case "", "Cluster", "Local":
	default:
		return fmt.Errorf("internal traffic policy %q", e.InternalTrafficPolicy)
	}
	// Kubernetes knows a few values and may add more: any short name
	// passes, and the importer's API server says whether it knows it.
	if e.TrafficDistribution != "" {
		if errs := validation.IsQualifiedName(e.TrafficDistribution); len(errs) > 0 {
			return fmt.Errorf("traffic distribution %q: %s", e.TrafficDistribution, errs[0])
		}
	}
	if err := validPorts(e.Ports, true); err != nil {
		return err
	}
	if err := validExportedMeta(e.Labels, true); err != nil {
		return err
	}
	if err := validExportedMeta(e.Annotations, false); err != nil {
		return err
	}
	for _, s := range e.Slices {
		if err := validPorts(s.Ports, false); err != nil {
			return fmt.Errorf("slice: %w", err)
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				return errors.New("an endpoint without addresses")
			}
			for _, a := range ep.Addresses {
				if !a.IsValid() || a.Zone() != "" {
					return fmt.Errorf("endpoint address %q", a)
				}
			}
			if ep.Hostname != "" {
				if errs := validation.IsDNS1123Label(ep.Hostname); len(errs) > 0 {
					return fmt.Errorf("endpoint hostname: %s", errs[0])
				}
			}
		}
	}
	return nil
}

func validPorts(ports []Port, service bool) error {
	if len(ports) > 100 {
		return fmt.Errorf("%d ports", len(ports))
	}
	for _, p := range ports {
		switch p.Protocol {
		case "TCP", "UDP", "SCTP":
		default:
			return fmt.Errorf("port protocol %q", p.Protocol)
		}
		if p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("port %d", p.Port)
		}
		if p.Name != "" {
			if errs := validation.IsValidPortName(p.Name); len(errs) > 0 && (service || len(p.Name) > 63) {
				return fmt.Errorf("port name %q: %s", p.Name, errs[0])
			}
		}
		if len(p.AppProtocol) > 253 {
			return errors.New("app protocol too long")
		}
	}
	return nil
}

// The ServiceImport types an export has.
const (
	TypeClusterSetIP = "ClusterSetIP"
	TypeHeadless     = "Headless"
)

// Inbox joins the pages of each cluster's snapshots and refuses replays:
// a snapshot is complete when all its pages at one serial are in, and a
// serial at or below the last one applied is never applied again. It is
// not safe for concurrent use.
type Inbox struct {
	applied map[string]uint64
	open    map[string]*assembly
}

type assembly struct {
	serial uint64
	pages  [][]Export
	got    int
}

// NewInbox returns an empty Inbox.
func NewInbox() *Inbox {
	return &Inbox{applied: map[string]uint64{}, open: map[string]*assembly{}}
}

// Add takes a verified page. It returns the snapshot when p completes
// one, ok false while pages are missing, and ErrReplay for a serial
// already applied or older (a periodic resend of the current one too:
// the caller counts it as a repeat, not an attack).
func (in *Inbox) Add(p Page) (s Snapshot, ok bool, err error) {
	if p.Serial <= in.applied[p.Cluster] {
		return Snapshot{}, false, fmt.Errorf("exports of %s, serial %d (applied %d): %w", p.Cluster, p.Serial, in.applied[p.Cluster], ErrReplay)
	}
	a := in.open[p.Cluster]
	switch {
	case a == nil || p.Serial > a.serial:
		a = &assembly{serial: p.Serial, pages: make([][]Export, p.Pages)}
		in.open[p.Cluster] = a
	case p.Serial < a.serial:
		return Snapshot{}, false, fmt.Errorf("exports of %s, serial %d (assembling %d): %w", p.Cluster, p.Serial, a.serial, ErrReplay)
	case len(a.pages) != p.Pages:
		return Snapshot{}, false, fmt.Errorf("exports of %s, serial %d: page %d of %d, earlier pages said of %d: %w",
			p.Cluster, p.Serial, p.Page, p.Pages, len(a.pages), ErrMalformed)
	}
	if a.pages[p.Page] == nil {
		a.got++
	}
	a.pages[p.Page] = append([]Export{}, p.Exports...)
	if a.got < len(a.pages) {
		return Snapshot{}, false, nil
	}
	delete(in.open, p.Cluster)
	in.applied[p.Cluster] = p.Serial
	return Snapshot{Cluster: p.Cluster, Serial: p.Serial, Exports: join(slices.Concat(a.pages...))}, true, nil
}

// Forget drops what the Inbox knows of cluster, so that its next
// snapshot applies whatever its serial (after cluster left for good).
func (in *Inbox) Forget(cluster string) {
	delete(in.applied, cluster)
	delete(in.open, cluster)
}

// join merges the parts of exports split over pages, in order.
func join(parts []Export) []Export {
	var out []Export
	at := map[string]int{}
	for _, e := range parts {
		if i, ok := at[e.Key()]; ok {
			out[i].Slices = append(out[i].Slices, e.Slices...)
			continue
		}
		at[e.Key()] = len(out)
		e.Slices = slices.Clone(e.Slices)
		out = append(out, e)
	}
	return out
}

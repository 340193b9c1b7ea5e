package mcsdns

import (
	"strings"
	"testing"
)

func TestParseName(t *testing.T) {
	for _, tc := range []struct {
		qname string
		want  name
	}{
		{"clusterset.local.", name{kind: nameApex}},
		{"dns-version.clusterset.local.", name{kind: nameVersion}},
		{"svc.clusterset.local.", name{kind: nameSvc}},
		{"shop.svc.clusterset.local.", name{kind: nameNS, ns: "shop"}},
		{"web.shop.svc.clusterset.local.", name{kind: nameService, svc: "web", ns: "shop"}},
		{"_http._tcp.web.shop.svc.clusterset.local.", name{kind: nameSRV, svc: "web", ns: "shop", first: "_http", second: "_tcp"}},
		{"web-0.cabc.web.shop.svc.clusterset.local.", name{kind: nameHost, svc: "web", ns: "shop", first: "web-0", second: "cabc"}},
		{"cabc.web.shop.svc.clusterset.local.", name{kind: nameMiddle, svc: "web", ns: "shop", first: "cabc"}},
		{"_tcp.web.shop.svc.clusterset.local.", name{kind: nameMiddle, svc: "web", ns: "shop", first: "_tcp"}},
		// Not a Service's: they do not exist.
		{"a.b.c.d.e.shop.svc.clusterset.local.", name{kind: nameOther}},
		{"_http.cabc.web.shop.svc.clusterset.local.", name{kind: nameOther}},
		{"web.sh_op.svc.clusterset.local.", name{kind: nameOther}},
		{"-web.shop.svc.clusterset.local.", name{kind: nameOther}},
		{"web..svc.clusterset.local.", name{kind: nameOther}},
		{"web.shop.pod.clusterset.local.", name{kind: nameOther}},
		{"web\\.x.shop.svc.clusterset.local.", name{kind: nameOther}},
		{"x.clusterset.local.", name{kind: nameOther}},
		{".svc.clusterset.local.", name{kind: nameOther}},
		{"_.web.shop.svc.clusterset.local.", name{kind: nameOther}},
	} {
		if got := parseName(tc.qname); got != tc.want {
			t.Errorf("parseName(%q) = %+v, want %+v", tc.qname, got, tc.want)
		}
	}
}

func TestInZone(t *testing.T) {
	for qname, want := range map[string]bool{
		"clusterset.local.":                  true,
		"web.shop.svc.clusterset.local.":     true,
		"web.shop.svc.cluster.local.":        false,
		"notclusterset.local.":               false,
		"example.com.":                       false,
		".":                                  false,
		"web.shop.svc.clusterset.local.com.": false,
	} {
		if got := inZone(qname); got != want {
			t.Errorf("inZone(%q) = %v, want %v", qname, got, want)
		}
	}
}

// FuzzParseName: any name a client sends is taken apart without a panic,
// and what comes back as a Service's name is made of DNS labels that
// build the name asked again.
func FuzzParseName(f *testing.F) {
	for _, s := range []string{
		"web.shop.svc.clusterset.local.", "_http._tcp.web.shop.svc.clusterset.local.",
		"web-0.cabc.web.shop.svc.clusterset.local.", "svc.clusterset.local.", "clusterset.local.",
		"a.b.c.d.e.f.svc.clusterset.local.", "\\000.svc.clusterset.local.", "..svc.clusterset.local.",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, qname string) {
		qname = strings.ToLower(qname)
		if !inZone(qname) {
			return
		}
		n := parseName(qname)
		var labels []string
		switch n.kind {
		case nameService:
			labels = []string{n.svc, n.ns}
		case nameSRV, nameHost:
			labels = []string{n.first, n.second, n.svc, n.ns}
		case nameMiddle:
			labels = []string{n.first, n.svc, n.ns}
		default:
			return
		}
		for _, l := range labels[len(labels)-2:] {
			if !isLabel(l) {
				t.Fatalf("parseName(%q) = %+v: %q is not a DNS label", qname, n, l)
			}
		}
		if again := strings.Join(labels, ".") + "." + svcSuffix; again != qname {
			t.Fatalf("parseName(%q) = %+v, which names %q", qname, n, again)
		}
	})
}

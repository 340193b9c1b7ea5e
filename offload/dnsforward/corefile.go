// Package dnsforward keeps a server block that forwards clusterset.local
// to the agent's DNS Service in the cluster's CoreDNS Corefile (opt-in,
// --coredns-forward), between markers of its own; it changes nothing
// else in the Corefile, and removing the block gives back the Corefile
// byte for byte as it was before.
package dnsforward

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The lines that open and close the agent's block. A Corefile comment
// starts with '#'; the words tell an operator who wrote it.
const (
	beginMarker = "# flotilla: begin clusterset.local forwarding (written by the flotilla agent; do not edit)"
	endMarker   = "# flotilla: end clusterset.local forwarding"
)

// Block is the agent's block forwarding the zone to addr (the ClusterIP
// of the agent's DNS Service), markers included, and the reverse zones
// of reverse (the views of peers' networks, where a headless Service's
// imported endpoints are) to the same address: CoreDNS asks the server
// block of the most specific zone, so a pod's reverse lookup of such an
// address reaches the agent instead of CoreDNS's upstream. Answers are
// kept 5 s, as the zone's records live; that a name does not exist, 1
// s, as the zone says (its negative TTL): CoreDNS's cache would
// otherwise keep it at least 5 s, and a client that asked before an
// import existed would wait that long for it.
func Block(addr netip.Addr, reverse []netip.Prefix) string {
	body := fmt.Sprintf(` {
    errors
    cache 5 {
        denial 9984 1
    }
    forward . %s
}
`, netip.AddrPortFrom(addr, 53))
	block := "clusterset.local:53" + body
	if zones := reverseZones(reverse); len(zones) > 0 {
		block += strings.Join(zones, " ") + body
	}
	return beginMarker + "\n" + block + endMarker + "\n"
}

// reverseZones are the server block keys of the prefixes' reverse zones,
// as CoreDNS reads them (10.70.0.0/16:53: CoreDNS expands a prefix off an
// octet's boundary into the zones it spans), sorted, each once; a
// prefix inside another adds nothing (CoreDNS refuses a zone twice).
func reverseZones(prefixes []netip.Prefix) []string {
	var ps []netip.Prefix
	for _, p := range prefixes {
		if p.IsValid() {
			ps = append(ps, p.Masked())
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var zones []string
	var last netip.Prefix
	for _, p := range ps {
		if last.IsValid() && last.Bits() <= p.Bits() && last.Contains(p.Addr()) {
			continue
		}
		last = p
		zones = append(zones, p.String()+":53")
	}
	return zones
}

// ErrMarkers is a Corefile whose markers are not one begin line followed
// by one end line: someone edited them, and the agent leaves it alone.
var ErrMarkers = errors.New("the flotilla markers are not one begin line followed by one end line")

// span is where the agent's block sits in a Corefile: from the newline
// before its begin line (or the start of the file) to the end of its end
// line, newline included; lead is that newline ("" at the start). ok is
// false when there is none.
func span(corefile string) (start, end int, lead string, ok bool, err error) {
	begins := lineIndexes(corefile, beginMarker)
	ends := lineIndexes(corefile, endMarker)
	switch {
	case len(begins) == 0 && len(ends) == 0:
		return 0, 0, "", false, nil
	case len(begins) != 1 || len(ends) != 1 || ends[0] < begins[0]:
		return 0, 0, "", false, ErrMarkers
	}
	start, end = begins[0], ends[0]+len(endMarker)
	if end < len(corefile) && corefile[end] == '\n' {
		end++
	}
	// The newline the block was appended after is the block's own.
	if start > 0 {
		start, lead = start-1, "\n"
	}
	return start, end, lead, true, nil
}

// lineIndexes are the offsets where line occurs as a whole line.
func lineIndexes(s, line string) []int {
	var at []int
	for off := 0; ; {
		i := strings.Index(s[off:], line)
		if i < 0 {
			return at
		}
		i += off
		off = i + len(line)
		startsLine := i == 0 || s[i-1] == '\n'
		endsLine := off == len(s) || s[off] == '\n'
		if startsLine && endsLine {
			at = append(at, i)
		}
	}
}

// WithBlock returns corefile with the agent's block set to block: in
// place of the one there, or appended after a newline of its own.
func WithBlock(corefile, block string) (string, error) {
	start, end, lead, ok, err := span(corefile)
	if err != nil {
		return "", err
	}
	if !ok {
		return corefile + "\n" + block, nil
	}
	return corefile[:start] + lead + block + corefile[end:], nil
}

// WithoutBlock returns corefile without the agent's block (and the
// newline appended before it): the Corefile as it was before the agent
// wrote there, whatever else changed around it since.
func WithoutBlock(corefile string) (string, error) {
	start, end, _, ok, err := span(corefile)
	if err != nil || !ok {
		return corefile, err
	}
	return corefile[:start] + corefile[end:], nil
}

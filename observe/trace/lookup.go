package trace

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// Decision is where a node's kernel sends a packet: the rule that
// matched and the route it found (Route nil: the rule itself ended the
// lookup, as a blackhole rule does).
type Decision struct {
	Rule  Rule
	Route *Route
}

// lookup does what the kernel's policy routing does for a packet from
// src to dst arriving on iif ("" for a packet from a pod or the host,
// whose input link no rule of ours names): rules by priority, in each
// table the longest prefix holding dst. Marks are unknown here, so rules
// that match a mark are passed over. The local table is not read: no
// trace goes to an address of the node itself.
func (k *Kernel) lookup(src, dst netip.Addr, iif string) (Decision, bool) {
	rules := slices.Clone(k.Rules)
	slices.SortStableFunc(rules, func(a, b Rule) int { return cmp.Compare(a.Priority, b.Priority) })
	for _, r := range rules {
		if !r.matches(src, dst, iif) {
			continue
		}
		switch r.Action {
		case "":
		case "goto":
			continue // rare; not followed here
		default:
			return Decision{Rule: r}, true
		}
		rt := k.longest(r.Table, dst)
		if rt == nil || rt.Type == "throw" {
			continue
		}
		if r.SuppressPrefixlen != nil && rt.Dst.Bits() <= *r.SuppressPrefixlen {
			continue
		}
		return Decision{Rule: r, Route: rt}, true
	}
	return Decision{}, false
}

func (r Rule) matches(src, dst netip.Addr, iif string) bool {
	if r.Mark != 0 || r.OifName != "" {
		return false
	}
	ok := (!r.Src.IsValid() || r.Src.Contains(src)) &&
		(!r.Dst.IsValid() || r.Dst.Contains(dst)) &&
		(r.IifName == "" || r.IifName == iif)
	return ok != r.Invert
}

// longest is table t's route holding dst with the longest prefix, the
// lowest metric among equals.
func (k *Kernel) longest(t int, dst netip.Addr) *Route {
	var best *Route
	for i := range k.Routes {
		r := &k.Routes[i]
		if r.Table != t || !r.Dst.Contains(dst) {
			continue
		}
		if best == nil || r.Dst.Bits() > best.Dst.Bits() || r.Dst.Bits() == best.Dst.Bits() && r.Metric < best.Metric {
			best = r
		}
	}
	return best
}

// ours reports whether the rule is the fabric's (our priority and
// protocol, our table).
func (r Rule) ours() bool {
	return r.Priority == RulePriority && r.Table == FabricTable && r.Protocol == OurProtocol && r.Action == ""
}

func (r Rule) String() string {
	s := strconv.Itoa(r.Priority) + ":"
	if r.Invert {
		s += " not"
	}
	if r.Src.IsValid() {
		s += " from " + r.Src.String()
	} else {
		s += " from all"
	}
	if r.Dst.IsValid() {
		s += " to " + r.Dst.String()
	}
	if r.IifName != "" {
		s += " iif " + r.IifName
	}
	if r.Action != "" {
		s += " " + r.Action
	} else {
		s += " lookup " + tableName(r.Table)
	}
	if r.Protocol != 0 {
		s += " proto " + protoName(r.Protocol)
	}
	return s
}

func (r Route) String() string {
	s := r.Dst.String()
	if r.Type != "" {
		s = r.Type + " " + s
	}
	if r.Gw.IsValid() {
		s += " via " + r.Gw.String()
	}
	if r.Dev != "" {
		s += " dev " + r.Dev
	}
	s += " table " + tableName(r.Table) + " proto " + protoName(r.Protocol)
	return s
}

func tableName(t int) string {
	switch t {
	case MainTable:
		return "main"
	case 253:
		return "default"
	case 255:
		return "local"
	}
	return strconv.Itoa(t)
}

// protoName names route protocols as ip(8) prints them.
func protoName(p int) string {
	switch p {
	case 0:
		return "unspec"
	case 1:
		return "redirect"
	case 2:
		return "kernel"
	case 3:
		return "boot"
	case 4:
		return "static"
	case 186:
		return "bgp"
	case 188:
		return "ospf"
	}
	return strconv.Itoa(p)
}

// delRule is the command that removes a foreign rule.
func delRule(r Rule) string {
	return fmt.Sprintf("ip rule del priority %d (%s)", r.Priority, r)
}

// delRoute is the command that removes a foreign route.
func delRoute(r Route) string {
	return fmt.Sprintf("ip route del %s table %s", r.Dst, tableName(r.Table))
}

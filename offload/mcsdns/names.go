package mcsdns

import (
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-io/flotilla/offload/mcs"
)

// The names the zone has, by the number of labels before svc.<zone>
// (KEP-1645's DNS specification, after the Kubernetes DNS specification).
const (
	nameApex    = iota // clusterset.local.
	nameVersion        // dns-version.clusterset.local.
	nameSvc            // svc.clusterset.local.: an empty non-terminal
	nameNS             // <ns>.svc...: an empty non-terminal
	nameService        // <svc>.<ns>.svc...
	nameMiddle         // <clusterid> or _<proto>, then <svc>.<ns>.svc...
	nameSRV            // _<port>._<proto>.<svc>.<ns>.svc...
	nameHost           // <hostname>.<clusterid>.<svc>.<ns>.svc...
	nameOther          // anything else in the zone: it does not exist
)

const (
	svcSuffix   = "svc." + mcs.Zone
	versionName = "dns-version." + mcs.Zone
)

// name is a query name in the zone taken apart. first and second are the
// labels before <svc>.<ns>: the port and protocol of an SRV name, the
// hostname and cluster ID of a headless endpoint's, or the one label of a
// middle name.
type name struct {
	kind          int
	svc, ns       string
	first, second string
}

// key is the Service a name is about, as the records are kept.
func (n name) key() string { return n.ns + "/" + n.svc }

// inZone reports whether qname (lowercase, fully qualified) is in the
// zone.
func inZone(qname string) bool {
	return qname == mcs.Zone || strings.HasSuffix(qname, "."+mcs.Zone)
}

// parseName takes apart qname, lowercase, fully qualified and in the zone.
// Names that cannot be a Service's (bad labels, too many of them) come
// back as nameOther: they do not exist, whatever the Services are. It
// reads a name any client sent, so it must take anything.
func parseName(qname string) name {
	switch qname {
	case mcs.Zone:
		return name{kind: nameApex}
	case versionName:
		return name{kind: nameVersion}
	case svcSuffix:
		return name{kind: nameSvc}
	}
	rest, ok := strings.CutSuffix(qname, "."+svcSuffix)
	if !ok || rest == "" {
		return name{kind: nameOther}
	}
	labels := strings.Split(rest, ".")
	if len(labels) > 4 {
		return name{kind: nameOther}
	}
	ns := labels[len(labels)-1]
	if !isLabel(ns) {
		return name{kind: nameOther}
	}
	if len(labels) == 1 {
		return name{kind: nameNS, ns: ns}
	}
	svc := labels[len(labels)-2]
	if !isLabel(svc) {
		return name{kind: nameOther}
	}
	n := name{svc: svc, ns: ns}
	switch len(labels) {
	case 2:
		n.kind = nameService
	case 3:
		n.kind, n.first = nameMiddle, labels[0]
		if !isLabel(strings.TrimPrefix(n.first, "_")) {
			return name{kind: nameOther}
		}
	case 4:
		n.first, n.second = labels[0], labels[1]
		port, portOK := strings.CutPrefix(n.first, "_")
		proto, protoOK := strings.CutPrefix(n.second, "_")
		switch {
		case portOK && protoOK && isLabel(port) && isLabel(proto):
			n.kind = nameSRV
		case !portOK && !protoOK && isLabel(n.first) && isLabel(n.second):
			n.kind = nameHost
		default:
			return name{kind: nameOther}
		}
	}
	return n
}

// isLabel reports whether s is an RFC 1123 label, as Kubernetes names,
// port names, endpoint hostnames and Flotilla's cluster IDs are.
func isLabel(s string) bool {
	return len(validation.IsDNS1123Label(s)) == 0
}

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

// output is a -o format, as kubectl get has them.
type output string

const (
	outputTable output = ""
	outputWide  output = "wide"
	outputJSON  output = "json"
	outputYAML  output = "yaml"
	outputName  output = "name"
)

// outputFlag defines -o and its long form --output, as kubectl has
// them, taking one of formats; the empty format is the table.
func outputFlag(cmd *cobra.Command, formats ...output) *string {
	o := new(string)
	cmd.Flags().StringVarP(o, "output", "o", "", "output format: "+formatList(formats)+"; empty: the table")
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = string(f)
	}
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(names, cobra.ShellCompDirectiveNoFileComp))
	return o
}

// parseOutput checks -o against the formats the command prints.
func parseOutput(s string, formats ...output) (output, error) {
	if o := output(s); o == outputTable || slices.Contains(formats, o) {
		return o, nil
	}
	return "", usageErrorf("-o %q: want %s (or nothing, for the table)", s, formatList(formats))
}

// The formats of the verbs that read.
var (
	peerFormats   = []output{outputWide, outputJSON, outputYAML, outputName}
	objectFormats = []output{outputJSON, outputYAML}
)

func formatList(formats []output) string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = string(f)
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// defaultWait is how long every verb that waits for the agent waits by
// default.
const defaultWait = time.Minute

// waitFlag defines --wait: how long to show progress and wait for the
// agent's outcome.
func waitFlag(cmd *cobra.Command) *time.Duration {
	return cmd.Flags().Duration("wait", defaultWait, "how long to show progress and wait for the agent's outcome (0: do not wait)")
}

// peerColumn is one column of a Peer table.
type peerColumn struct {
	header string
	value  func(p v1alpha1.Peer, now time.Time) string
}

var (
	colCluster    = peerColumn{"CLUSTER", func(p v1alpha1.Peer, _ time.Time) string { return orDash(p.Status.ClusterName) }}
	colID         = peerColumn{"ID", func(p v1alpha1.Peer, _ time.Time) string { return p.Name }}
	colPhase      = peerColumn{"PHASE", func(p v1alpha1.Peer, _ time.Time) string { return orDash(string(p.Status.Phase)) }}
	colNetworking = peerColumn{"NETWORKING", func(p v1alpha1.Peer, _ time.Time) string { return decision(string(p.Spec.Networking)) }}
	colEndpoint   = peerColumn{"ENDPOINT", func(p v1alpha1.Peer, _ time.Time) string { return orDash(p.Status.Endpoint) }}
	colTheirs     = peerColumn{"THEIRS AS SEEN HERE", func(p v1alpha1.Peer, _ time.Time) string { return views(p.Status.TheirNetworks) }}
	colOurs       = peerColumn{"OURS AS SEEN THERE", func(p v1alpha1.Peer, _ time.Time) string { return views(p.Status.MyNetworks) }}
	colHandshake  = peerColumn{"HANDSHAKE", func(p v1alpha1.Peer, now time.Time) string { return age(p.Status.LastHandshake, now) }}
	colHosting    = peerColumn{"HOSTING", func(p v1alpha1.Peer, _ time.Time) string {
		return reason(p.Status.Conditions, v1alpha1.ConditionOffloadGranted)
	}}
	colOffload = peerColumn{"OFFLOAD", func(p v1alpha1.Peer, _ time.Time) string {
		return reason(p.Status.Conditions, v1alpha1.ConditionOffloadCredential)
	}}
	// TRAFFIC is the mode in effect (spec.traffic, else --traffic), as the
	// agent wrote it.
	colTraffic = peerColumn{"TRAFFIC", func(p v1alpha1.Peer, _ time.Time) string { return traffic(p.Status) }}
	colSources = peerColumn{"SOURCES", func(p v1alpha1.Peer, _ time.Time) string { return orDash(strings.Join(p.Status.Sources, ",")) }}
	colAge     = peerColumn{"AGE", func(p v1alpha1.Peer, now time.Time) string {
		return strings.TrimSuffix(age(&p.CreationTimestamp, now), " ago")
	}}
)

// The tables: peer list's is short, status's says everything about the
// peering at a glance (as it always has), and -o wide adds the admin's
// decisions and where the peer was found.
var (
	peerListColumns   = []peerColumn{colCluster, colID, colPhase, colNetworking, colEndpoint, colHandshake, colAge}
	peerStatusColumns = []peerColumn{colCluster, colID, colPhase, colEndpoint, colTheirs, colOurs, colHandshake, colHosting, colOffload, colTraffic}
	peerWideColumns   = []peerColumn{colCluster, colID, colPhase, colNetworking, colEndpoint, colTheirs, colOurs, colHandshake,
		colHosting, colOffload, colTraffic, colSources, colAge}
)

// decision prints a spec field the admin left empty as what it means: the
// agent's flag decides.
func decision(v string) string {
	if v == "" {
		return "(default)"
	}
	return v
}

// writePeers prints peers in format o; table is the columns of the
// default table.
func writePeers(w io.Writer, peers []v1alpha1.Peer, o output, table []peerColumn, now time.Time) error {
	peers = append([]v1alpha1.Peer(nil), peers...)
	sort.Slice(peers, func(i, j int) bool {
		if peers[i].Status.ClusterName != peers[j].Status.ClusterName {
			return peers[i].Status.ClusterName < peers[j].Status.ClusterName
		}
		return peers[i].Name < peers[j].Name
	})
	switch o {
	case outputJSON, outputYAML:
		return writePeerList(w, peers, o)
	case outputName:
		for _, p := range peers {
			fmt.Fprintf(w, "peer.%s/%s\n", v1alpha1.GroupVersion.Group, p.Name)
		}
		return nil
	case outputWide:
		table = peerWideColumns
	}
	if len(peers) == 0 {
		fmt.Fprintln(w, "No peers yet: no other cluster of the federation has been discovered.")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	headers := make([]string, len(table))
	for i, c := range table {
		headers[i] = c.header
	}
	fmt.Fprintln(tw, strings.Join(headers, "\t"))
	for _, p := range peers {
		cells := make([]string, len(table))
		for i, c := range table {
			cells[i] = c.value(p, now)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// writePeerList prints the Peers as kubectl get -o json|yaml does: a v1
// List that kubectl apply reads back, without managedFields.
func writePeerList(w io.Writer, peers []v1alpha1.Peer, o output) error {
	items := make([]v1alpha1.Peer, len(peers))
	for i, p := range peers {
		p.APIVersion, p.Kind = v1alpha1.GroupVersion.String(), "Peer"
		p.ManagedFields = nil
		items[i] = p
	}
	list := struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Items      []v1alpha1.Peer `json:"items"`
	}{"v1", "List", items}
	return writeJSONOrYAML(w, list, o)
}

// writeJSONOrYAML prints v as kubectl does: indented JSON, or YAML for -o
// yaml.
func writeJSONOrYAML(w io.Writer, v any, o output) error {
	out, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return err
	}
	if o == outputYAML {
		if out, err = yaml.JSONToYAML(out); err != nil {
			return err
		}
	} else {
		out = append(out, '\n')
	}
	_, err = w.Write(out)
	return err
}

// writeObject prints one object of ours as kubectl get KIND NAME -o
// json|yaml does (without managedFields), or -o name as
// resource.group/name: what the grant and offload verbs print once done.
func writeObject(w io.Writer, obj client.Object, kind, resource string, o output) error {
	if o == outputName {
		_, err := fmt.Fprintf(w, "%s.%s/%s\n", resource, v1alpha1.GroupVersion.Group, obj.GetName())
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(v1alpha1.GroupVersion.WithKind(kind))
	obj.SetManagedFields(nil)
	return writeJSONOrYAML(w, obj, o)
}

// writeOffloads prints NamespaceOffloads as a table; wide adds the
// remote namespaces.
func writeOffloads(w io.Writer, os []v1alpha1.NamespaceOffload, o output) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	headers := "NAMESPACE\tPHASE\tMAPPING\tPODS\tCLUSTERS"
	if o == outputWide {
		headers += "\tREMOTE NAMESPACES\tSELECTOR"
	}
	fmt.Fprintln(tw, headers)
	for _, x := range os {
		var clusters, remote []string
		for _, c := range x.Status.Clusters {
			clusters = append(clusters, orDash(c.ClusterName))
			remote = append(remote, orDash(c.RemoteNamespace))
		}
		row := []string{x.Namespace, orDash(string(x.Status.Phase)), orDash(string(x.Spec.NamespaceMapping)), orDash(string(x.Spec.PodOffloading)), orDash(strings.Join(clusters, ","))}
		if o == outputWide {
			sel := "(none: selects no peer)"
			if s := x.Spec.ClusterSelector; s != nil && (len(s.MatchLabels) > 0 || len(s.MatchExpressions) > 0) {
				sel = metav1.FormatLabelSelector(x.Spec.ClusterSelector)
			}
			row = append(row, orDash(strings.Join(remote, ",")), sel)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// every lists each command of the tree under root, root first.
func every(root *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{root}
	for _, c := range root.Commands() {
		out = append(out, every(c)...)
	}
	return out
}

// path is the command line that reaches c, without the program's name.
func path(c *cobra.Command) []string {
	return strings.Fields(c.CommandPath())[1:]
}

// The commands that talk to no cluster, or to the one they run in.
var offCluster = []string{
	"flotilla", "flotilla agent", "flotilla fabric", "flotilla cleanup", "flotilla ledger", "flotilla ledger show",
	"flotilla token", "flotilla key", "flotilla key generate", "flotilla peer", "flotilla offload",
	"flotilla unoffload", "flotilla help", "flotilla docs",
	"flotilla verify-pod", "flotilla verify-pod serve", "flotilla verify-pod probe",
}

// -h and --help are help, on stdout with exit status 0, for every command
// and verb, wherever they stand.
func TestEveryCommandHelps(t *testing.T) {
	root := newRoot()
	root.InitDefaultCompletionCmd()
	for _, c := range every(root) {
		for _, h := range []string{"-h", "--help"} {
			args := append(path(c), h)
			code, out, errOut := flotilla(args...)
			if code != 0 || !strings.Contains(out, "Usage:\n  "+c.CommandPath()) || errOut != "" {
				t.Errorf("%q: exit %d\n%s%s", args, code, out, errOut)
			}
		}
	}
}

// Every command that talks to a cluster takes --kubeconfig and --context,
// as kubectl does.
func TestClusterFlagsEverywhere(t *testing.T) {
	for _, c := range every(newRoot()) {
		if slices.Contains(offCluster, c.CommandPath()) {
			continue
		}
		for _, name := range []string{"kubeconfig", "context"} {
			if c.Flags().Lookup(name) == nil {
				t.Errorf("%s has no --%s", c.CommandPath(), name)
			}
		}
	}
}

// Without a kubeconfig, every command that talks to a cluster says how to
// name one, not client-go's words.
func TestNoClusterSaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBECONFIG", filepath.Join(dir, "none"))
	t.Setenv("HOME", dir)
	// Not a pod: no in-cluster configuration either.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	os.Unsetenv("KUBERNETES_SERVICE_HOST")
	for _, args := range [][]string{
		{"status"}, {"peer", "list"}, {"peer", "show", "beta"}, {"peer", "accept", "beta"}, {"peer", "deny", "beta"},
		{"grant", "beta"}, {"revoke", "beta"}, {"offload", "namespace", "shop", "--selector", "a=b"}, {"unoffload", "namespace", "shop"},
		{"key", "status"}, {"key", "rotate"}, {"graph"}, {"trace", "a", "b"}, {"info"},
		{"verify", "--remote-context", "beta"}, {"gather", "-o", filepath.Join(dir, "bundle")},
	} {
		code, _, errOut := flotilla(args...)
		if code != 1 || !strings.Contains(errOut, "no cluster: pass --kubeconfig or set KUBECONFIG") || strings.Contains(errOut, "KUBERNETES_MASTER") {
			t.Errorf("%q without a cluster: exit %d, %s", args, code, errOut)
		}
	}
}

// Every verb that reads takes -o json and -o yaml.
func TestReadVerbsPrintJSONAndYAML(t *testing.T) {
	root := newRoot()
	for _, line := range []string{"status", "peer list", "peer show", "key status", "ledger show", "version", "trace", "graph", "info", "verify"} {
		c, _, err := root.Find(strings.Fields(line))
		if err != nil || c.CommandPath() != "flotilla "+line {
			t.Errorf("%s: %v", line, err)
			continue
		}
		f := c.Flags().ShorthandLookup("o")
		if f == nil || !strings.Contains(f.Usage, "json") || (!strings.Contains(f.Usage, "yaml") && line != "graph") {
			t.Errorf("%s: -o is %+v", line, f)
		}
	}
}

// One --wait, with one default, on every verb that waits for the agent.
func TestOneWaitDefault(t *testing.T) {
	for _, c := range every(newRoot()) {
		if f := c.Flags().Lookup("wait"); f != nil && f.DefValue != defaultWait.String() {
			t.Errorf("%s --wait defaults to %s, not %s", c.CommandPath(), f.DefValue, defaultWait)
		}
	}
	for _, line := range []string{"peer accept", "peer deny", "grant", "revoke", "offload namespace", "unoffload namespace", "key rotate", "key install", "key use", "key remove"} {
		c, _, _ := newRoot().Find(strings.Fields(line))
		if c.Flags().Lookup("wait") == nil {
			t.Errorf("%s has no --wait", line)
		}
	}
}

func TestClusterListPairs(t *testing.T) {
	for _, tc := range []struct {
		kubeconfigs, contexts []string
		want                  []clusterRef
		wantErr               string
	}{
		{want: []clusterRef{{}}},
		{kubeconfigs: []string{"a", "b"}, want: []clusterRef{{"a", ""}, {"b", ""}}},
		{contexts: []string{"x", "y"}, want: []clusterRef{{"", "x"}, {"", "y"}}},
		{kubeconfigs: []string{"a"}, contexts: []string{"x", "y"}, want: []clusterRef{{"a", "x"}, {"a", "y"}}},
		{kubeconfigs: []string{"a", "b"}, contexts: []string{"x", "y"}, want: []clusterRef{{"a", "x"}, {"b", "y"}}},
		{kubeconfigs: []string{"a", "b", "c"}, contexts: []string{"x", "y"}, wantErr: "3 --kubeconfig and 2 --context"},
	} {
		got, err := clusterList{tc.kubeconfigs, tc.contexts}.refs()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v %v: %v, want an error with %q", tc.kubeconfigs, tc.contexts, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v %v: %v, %v; want %v", tc.kubeconfigs, tc.contexts, got, err, tc.want)
		}
	}
}

// Unknown commands and flags are usage errors (exit 2) that say what to
// do; a near miss names the command meant.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "flotilla: say which command to run"},
		{[]string{"stauts"}, `unknown command "stauts"; did you mean status?`},
		{[]string{"status", "--bogus"}, "flotilla status: unknown flag: --bogus\nRun 'flotilla status -h' for help."},
		{[]string{"grant"}, "flotilla grant: name the peer"},
		{[]string{"trace", "a"}, "flotilla trace: name the SOURCE and the DESTINATION"},
		{[]string{"graph", "--context", "a", "--context", "b", "--kubeconfig", "x", "--kubeconfig", "y", "--kubeconfig", "z"}, "3 --kubeconfig and 2 --context"},
		{[]string{"key", "install"}, "flotilla key install: give --key-file"},
		{[]string{"key", "remove"}, "give --key-file or --fingerprint"},
		{[]string{"version", "-o", "wide"}, `-o "wide": want json or yaml`},
	} {
		code, _, errOut := flotilla(tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// docs/cli.md is what the commands' help says.
func TestCLIDocsCurrent(t *testing.T) {
	var want strings.Builder
	if err := writeDocs(&want); err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatalf("%v: run make docs", err)
	}
	if string(have) != want.String() {
		t.Errorf("docs/cli.md differs from the commands' help: run make docs (it writes docs/cli.md from `flotilla docs`)")
	}
}

// completion prints cobra's script for each shell; bash, loaded with it,
// completes a command's name and an -o format by asking the binary.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_flotilla", "zsh": "#compdef flotilla", "fish": "complete -c flotilla"} {
		code, out, errOut := flotilla("completion", shell)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d, %q not in\n%.300s%s", shell, code, want, out, errOut)
		}
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(dir, "flotilla")); err != nil {
		t.Fatal(err)
	}
	complete := func(line string) string {
		t.Helper()
		words := strings.Fields(line)
		if strings.HasSuffix(line, " ") {
			words = append(words, "")
		}
		// bash-completion's word splitter, which the script calls, where
		// the package is not installed: the words as bash split them.
		script := fmt.Sprintf(`[ -r /usr/share/bash-completion/bash_completion ] && source /usr/share/bash-completion/bash_completion
declare -F _get_comp_words_by_ref >/dev/null || _get_comp_words_by_ref() {
	cur="${COMP_WORDS[COMP_CWORD]}"; prev="${COMP_WORDS[COMP_CWORD-1]}"; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD
}
source <(flotilla completion bash)
COMP_LINE=%q; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(%s); COMP_CWORD=%d
__start_flotilla
printf '%%s\n' "${COMPREPLY[@]}"`, line, quoteWords(words), len(words)-1)
		cmd := exec.Command(bash, "--norc", "--noprofile", "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		// Stdout only: bash's compopt complains on stderr outside a real
		// completion.
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bash completing %q: %v\n%s", line, err, out)
		}
		return string(out)
	}
	if got := complete("flotilla pe"); strings.TrimSpace(got) != "peer" {
		t.Errorf("completing %q: %q, want peer", "flotilla pe", got)
	}
	if got := strings.Fields(complete("flotilla peer list -o ")); !slices.Equal(got, []string{"wide", "json", "yaml", "name"}) {
		t.Errorf("completing -o of peer list: %q", got)
	}
	if got := complete("flotilla offload namespace shop --sel"); strings.TrimSpace(got) != "--selector" {
		t.Errorf("completing --sel: %q", got)
	}
}

func quoteWords(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = fmt.Sprintf("%q", w)
	}
	return strings.Join(q, " ")
}

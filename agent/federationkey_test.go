package agent

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"

	"github.com/flotilla-io/flotilla/agent/agentapi"
)

// memberRing is memberlist's own keyring, the one discovery drives, with
// discovery's names.
type memberRing struct{ *memberlist.Keyring }

func (r memberRing) Keys() [][]byte            { return r.GetKeys() }
func (r memberRing) InstallKey(k []byte) error { return r.AddKey(k) }

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// Each phase of a rotation, applied to a keyring in any earlier phase,
// leaves exactly the keys listed, the first one encrypting; a keyring that
// lists nothing is refused and changes nothing.
func TestApplyKeyring(t *testing.T) {
	old, next, other := testKey(1), testKey(2), testKey(3)
	for _, c := range []struct {
		name      string
		held      [][]byte
		want      [][]byte
		changed   bool
		wantError string
	}{
		{"install", [][]byte{old}, [][]byte{old, next}, true, ""},
		{"use", [][]byte{old, next}, [][]byte{next, old}, true, ""},
		{"remove", [][]byte{next, old}, [][]byte{next}, true, ""},
		{"install and use at once", [][]byte{old}, [][]byte{next, old}, true, ""},
		{"straight to the end", [][]byte{old}, [][]byte{next}, true, ""},
		{"a stray key goes", [][]byte{old, other}, [][]byte{old, next}, true, ""},
		{"already there", [][]byte{next, old}, [][]byte{next, old}, false, ""},
		{"nothing listed", [][]byte{old}, nil, false, "no key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ring, err := memberlist.NewKeyring(c.held[1:], c.held[0])
			if err != nil {
				t.Fatal(err)
			}
			changed, err := applyKeyring(memberRing{ring}, c.want)
			if c.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantError) {
					t.Fatalf("error %v, want one saying %q", err, c.wantError)
				}
				c.want = c.held
			} else if err != nil {
				t.Fatal(err)
			}
			if changed != c.changed {
				t.Errorf("changed %v, want %v", changed, c.changed)
			}
			got := ring.GetKeys()
			if !bytes.Equal(got[0], c.want[0]) || len(got) != len(c.want) {
				t.Fatalf("holds %v, want %v (primary first)", agentapi.Fingerprints(got), agentapi.Fingerprints(c.want))
			}
			for _, k := range c.want {
				if !containsKey(got, k) {
					t.Errorf("holds %v, want %v", agentapi.Fingerprints(got), agentapi.Fingerprints(c.want))
				}
			}
		})
	}
}

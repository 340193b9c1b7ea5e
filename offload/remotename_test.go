package offload

import (
	"strings"
	"testing"

	"github.com/flotilla-io/flotilla/api/v1alpha1"
)

func TestRemoteNamespace(t *testing.T) {
	const consumer = "cq3x7bd2kfx6lmjwuq4ntr5yzea"                  // suffix q3x7bd
	long := strings.Repeat("a", 50) + "-" + strings.Repeat("b", 12) // 63 chars
	for _, tc := range []struct {
		name                string
		mapping             v1alpha1.NamespaceMapping
		local, remote, cons string
		want, err           string
	}{
		{"default", v1alpha1.MappingDefaultName, "shop", "", consumer, "shop-q3x7bd", ""},
		{"empty mapping is default", "", "shop", "", consumer, "shop-q3x7bd", ""},
		{"default ignores remoteName", v1alpha1.MappingDefaultName, "shop", "other", consumer, "shop-q3x7bd", ""},
		{"default just fits", v1alpha1.MappingDefaultName, strings.Repeat("x", 56), "", consumer, strings.Repeat("x", 56) + "-q3x7bd", ""},
		// The hashes are the first 8 hex digits of sha256 of the local name,
		// computed apart (python3 hashlib).
		{"default one over: hashed", v1alpha1.MappingDefaultName, strings.Repeat("x", 57), "", consumer, strings.Repeat("x", 47) + "-" + "ae14a256" + "-q3x7bd", ""},
		{"default of a 63-char name", v1alpha1.MappingDefaultName, long, "", consumer, long[:47] + "-" + "d16b3e58" + "-q3x7bd", ""},
		{"same name", v1alpha1.MappingSameName, "shop", "", consumer, "shop", ""},
		{"selected", v1alpha1.MappingSelected, "shop", "shop-eu", consumer, "shop-eu", ""},
		{"selected without a name", v1alpha1.MappingSelected, "shop", "", consumer, "", "needs a remoteName"},
		{"selected uppercase", v1alpha1.MappingSelected, "shop", "Shop", consumer, "", `"Shop" is not a valid namespace name`},
		{"selected path", v1alpha1.MappingSelected, "shop", "../x", consumer, "", `"../x" is not a valid namespace name`},
		{"selected 64 chars", v1alpha1.MappingSelected, "shop", strings.Repeat("a", 64), consumer, "", "is not a valid namespace name"},
		{"local invalid", v1alpha1.MappingSameName, "Shop", "", consumer, "", `"Shop" is not a valid namespace name`},
		{"local empty", v1alpha1.MappingDefaultName, "", "", consumer, "", `"" is not a valid namespace name`},
		{"local too long", v1alpha1.MappingDefaultName, strings.Repeat("a", 64), "", consumer, "", "is not a valid namespace name"},
		{"unknown mapping", "Random", "shop", "", consumer, "", `mapping "Random": want DefaultName, SameName or Selected`},
		{"consumer not an ID", v1alpha1.MappingDefaultName, "shop", "", "c12", "", "consumer"},
		{"consumer empty", v1alpha1.MappingSameName, "shop", "", "", "", "consumer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RemoteNamespace(tc.mapping, tc.local, tc.remote, tc.cons)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("RemoteNamespace = %q, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("RemoteNamespace = %q, %v; want %q", got, err, tc.want)
			}
			if len(got) > 63 {
				t.Errorf("%q is %d characters", got, len(got))
			}
		})
	}
}

// The hash tells apart long names that share their first 47 characters.
func TestRemoteNamespaceLongNamesDiffer(t *testing.T) {
	const consumer = "cq3x7bd2kfx6lmjwuq4ntr5yzea"
	base := strings.Repeat("a", 55)
	a, err := RemoteNamespace(v1alpha1.MappingDefaultName, base+"-one", "", consumer)
	if err != nil {
		t.Fatal(err)
	}
	b, err := RemoteNamespace(v1alpha1.MappingDefaultName, base+"-two", "", consumer)
	if err != nil {
		t.Fatal(err)
	}
	if a == b || len(a) != 63 || len(b) != 63 {
		t.Errorf("long names map to %q and %q, want two different 63-character names", a, b)
	}
}

// A provider mirrors a namespace for a consumer, unless its admin allows
// any name, only under the suffix DefaultName gives it.
func TestSuffixed(t *testing.T) {
	consumer := "c4x7k2qabcdefghijklmnopqrst"
	def, err := RemoteNamespace(v1alpha1.MappingDefaultName, "shop", "", consumer)
	if err != nil {
		t.Fatal(err)
	}
	long, err := RemoteNamespace(v1alpha1.MappingDefaultName, strings.Repeat("a", 63), "", consumer)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{def, true},
		{long, true},
		{"monitoring", false},
		{"4x7k2q", false},            // the suffix alone, without its dash
		{"shop-4x7k2", false},        // one character short
		{"shop-" + consumer, false},  // the whole ID is not the suffix
		{"shop-4x7k2q-other", false}, // not at the end
		{"monitoring-4x7k2q", true},  // any name that ends so is its own
		{"shop-5x7k2q", false},       // another consumer's
	} {
		if got := Suffixed(tc.name, consumer); got != tc.want {
			t.Errorf("Suffixed(%q, %s) = %v, want %v", tc.name, consumer, got, tc.want)
		}
	}
}

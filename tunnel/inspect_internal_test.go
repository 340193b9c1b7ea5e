package tunnel

import (
	"net/netip"
	"testing"
)

// TestRuleKeyReadsBack: what Inspect reads from a rule's comment is the
// rule the tunnel wrote.
func TestRuleKeyReadsBack(t *testing.T) {
	for _, r := range []NATRule{
		{Kind: SNAT, Match: netip.MustParsePrefix("10.0.0.0/16"), To: netip.MustParsePrefix("10.71.0.0/16")},
		{Kind: DNAT, Match: netip.MustParsePrefix("10.71.0.0/16"), To: netip.MustParsePrefix("10.0.0.0/16")},
	} {
		got, ok := parseRuleKey(r.Key("c-1"), "c-1")
		if !ok || got != r {
			t.Errorf("%q read back as %+v, %v", r.Key("c-1"), got, ok)
		}
		if _, ok := parseRuleKey(r.Key("c-2"), "c-1"); ok {
			t.Errorf("%q read as peer c-1's", r.Key("c-2"))
		}
	}
	for _, bad := range []string{"", "flotilla peer=c-1 masq 10.0.0.0/16 to 10.1.0.0/16", "flotilla peer=c-1 snat 10.0.0.0/16", "flotilla dispatch by peer"} {
		if r, ok := parseRuleKey(bad, "c-1"); ok {
			t.Errorf("%q read as %+v", bad, r)
		}
	}
}

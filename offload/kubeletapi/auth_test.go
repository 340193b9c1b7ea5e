package kubeletapi

import "testing"

// A question to the cache is the same whatever the order of the caller's
// groups, and HEAD asks what GET does; another user, other groups,
// another verb or another node is another question.
func TestQuestionOf(t *testing.T) {
	alice := kubeletUser{name: "alice", groups: []string{"b", "a"}}
	base := questionOf(alice, "GET", "n1")
	for _, tc := range []struct {
		what   string
		q      proxyQuestion
		repeat bool
	}{
		{"groups in another order", questionOf(kubeletUser{name: "alice", groups: []string{"a", "b"}}, "GET", "n1"), true},
		{"HEAD", questionOf(alice, "HEAD", "n1"), true},
		{"another user", questionOf(kubeletUser{name: "bob", groups: alice.groups}, "GET", "n1"), false},
		{"other groups", questionOf(kubeletUser{name: "alice"}, "GET", "n1"), false},
		{"another verb", questionOf(alice, "POST", "n1"), false},
		{"another node", questionOf(alice, "GET", "n2"), false},
	} {
		if got := tc.q == base; got != tc.repeat {
			t.Errorf("%s: the same question %v, want %v (%+v, %+v)", tc.what, got, tc.repeat, tc.q, base)
		}
	}
}

package federation

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// An exchange passes only when the intended pod of the intended cluster
// answered and saw the caller at the expected address. The identity view
// case: both clusters use 10.0.0.0/16 and each has a pod "web" at
// 10.0.0.2; a view that leaves the address as it is sends a's GET to a's
// own pod, which answers with the same name and sees the caller at the
// address b's view would show too. Only the UID tells.
func TestCheckAnswer(t *testing.T) {
	webB := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: "uid-of-b"}}
	want := netip.MustParseAddr("100.96.0.2")
	for _, tc := range []struct {
		name, body, err string
	}{
		{"b's pod answers", "host web\nuid uid-of-b\npeer 100.96.0.2\n", ""},
		{"an identity view loops back to a's own pod", "host web\nuid uid-of-a\npeer 100.96.0.2\n", "answered by pod web (uid uid-of-a), not b's pod web (uid uid-of-b)"},
		{"another pod of b", "host web-w1\nuid uid-of-w1\npeer 100.96.0.2\n", "answered by pod web-w1"},
		{"b's pod sees the caller untranslated", "host web\nuid uid-of-b\npeer 10.0.0.2\n", "saw the caller as 10.0.0.2, want 100.96.0.2"},
		{"a test server that does not know its UID", "host web\nuid \npeer 100.96.0.2\n", "want host, uid and peer"},
		{"an older test server", "host web\npeer 100.96.0.2\n", "want host, uid and peer"},
		{"not the test server", "<html>hello</html>", "want host, uid and peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkAnswer(tc.body, "b", webB, want)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("%v, want no error", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("%v, want an error with %q", err, tc.err)
			}
		})
	}
}

package federation

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-io/flotilla/test/harness"
)

// An exchange passes only when the intended pod of the intended cluster
// answered and saw the caller at the expected address. The identity view
// case: both clusters use 10.0.0.0/16 and each has a pod "web" at
// 10.0.0.2; a view that leaves the address as it is sends a's GET to a's
// own pod, which answers with the same name and sees the caller at the
// address b's view would show too. Only the UID tells.
func TestCheckAnswer(t *testing.T) {
	webB := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: "uid-of-b"}}
	// Behind a Service: any of its pods may answer.
	web1 := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-1", UID: "uid-of-1"}}
	web2 := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-2", UID: "uid-of-2"}}
	want := netip.MustParseAddr("100.96.0.2")
	for _, tc := range []struct {
		name, body string
		pods       []corev1.Pod
		err        string
	}{
		{"b's pod answers", "host web\nuid uid-of-b\npeer 100.96.0.2\n", []corev1.Pod{webB}, ""},
		{"an identity view loops back to a's own pod", "host web\nuid uid-of-a\npeer 100.96.0.2\n", []corev1.Pod{webB}, "answered by pod web (uid uid-of-a), not b's pod web (uid uid-of-b)"},
		{"another pod of b", "host web-w1\nuid uid-of-w1\npeer 100.96.0.2\n", []corev1.Pod{webB}, "answered by pod web-w1"},
		{"b's pod sees the caller untranslated", "host web\nuid uid-of-b\npeer 10.0.0.2\n", []corev1.Pod{webB}, "saw the caller as 10.0.0.2, want 100.96.0.2"},
		{"a test server that does not know its UID", "host web\nuid \npeer 100.96.0.2\n", []corev1.Pod{webB}, "want host, uid and peer"},
		{"an older test server", "host web\npeer 100.96.0.2\n", []corev1.Pod{webB}, "want host, uid and peer"},
		{"not the test server", "<html>hello</html>", []corev1.Pod{webB}, "want host, uid and peer"},
		{"the second pod behind a Service", "host web-2\nuid uid-of-2\npeer 100.96.0.2\n", []corev1.Pod{web1, web2}, ""},
		{"a pod of the caller's cluster named as one behind the Service", "host web-2\nuid uid-of-a\npeer 100.96.0.2\n", []corev1.Pod{web1, web2}, "answered by pod web-2 (uid uid-of-a), not one of b's pods web-1 (uid uid-of-1), web-2 (uid uid-of-2)"},
		{"one pod's name with the other's UID", "host web-1\nuid uid-of-2\npeer 100.96.0.2\n", []corev1.Pod{web1, web2}, "answered by pod web-1 (uid uid-of-2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CheckAnswer(tc.body, want, "b", tc.pods...)
			checkErr(t, err, tc.err)
		})
	}
}

// The line-echo answer (the test server's TCP port, testserver -probe)
// says who answered too, and the same check applies: the loop-back to
// the caller's own pod, same name and address, fails by its UID.
func TestAnsweredByOverTCP(t *testing.T) {
	webB := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-w1", UID: "uid-of-b"}}
	for _, tc := range []struct {
		name, line, err string
	}{
		{"b's pod answers", "100.96.0.2 web-w1 uid-of-b\n", ""},
		{"an identity view loops back to a's own pod", "100.96.0.2 web-w1 uid-of-a\n", "answered by pod web-w1 (uid uid-of-a), not b's pod web-w1 (uid uid-of-b)"},
		{"a test server that does not know its UID", "100.96.0.2 web-w1\n", "answered by pod web-w1 (uid ), not b's pod"},
		{"not a line-echo server", "SSH-2.0-OpenSSH_9.2\n", "is not an address, a name and maybe a UID"},
		{"nothing", "\n", "is not an address, a name and maybe a UID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := harness.ParseHello(tc.line)
			if err == nil {
				err = AnsweredBy(a, "b", webB)
			}
			checkErr(t, err, tc.err)
		})
	}
}

// checkErr fails t unless err is nil where want is empty, or an error
// holding want.
func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%v, want no error", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("%v, want an error with %q", err, want)
	}
}

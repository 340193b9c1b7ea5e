package kubeletapi

import (
	"net/url"
	"testing"
)

// Query parameters are passed on as the provider's API names them, and
// nothing else.
func TestKubeletRouteParams(t *testing.T) {
	for _, tc := range []struct {
		route kubeletRoute
		in    string
		want  string
	}{
		{routeLogs, "follow=true&tailLines=5&timestamps=true&sinceSeconds=10&previous=true&limitBytes=9&stream=All&other=x",
			"container=c&follow=true&limitBytes=9&previous=true&sinceSeconds=10&tailLines=5&timestamps=true"},
		{routeLogs, "sinceTime=2025-01-01T00:00:00Z&stream=Stderr", "container=c&sinceTime=2025-01-01T00%3A00%3A00Z&stream=Stderr"},
		{routeExec, "command=sh&command=-c&command=echo+hi&input=1&output=1&error=1&tty=1&stdin=0",
			"command=sh&command=-c&command=echo+hi&container=c&stderr=1&stdin=1&stdout=1&tty=1"},
		{routeAttach, "output=1&command=no", "container=c&stdout=1"},
		{routePortForward, "port=8080,9090&port=22", "ports=8080&ports=9090&ports=22"},
	} {
		in, err := url.ParseQuery(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := tc.route.params(in, "c").Encode(); got != tc.want {
			t.Errorf("%s ?%s: %s, want %s", tc.route.name, tc.in, got, tc.want)
		}
	}
}

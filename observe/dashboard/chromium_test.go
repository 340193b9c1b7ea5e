package dashboard

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/flotilla-io/flotilla/test/harness"
)

// chromiumFlags start Debian's Chromium headless, as it runs here (no
// sandbox, no GPU, nothing fetched besides the page).
func chromiumFlags(profile string) []string {
	return []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + profile,
	}
}

// startChromium starts Chromium with a profile of its own in a temporary
// directory. It and every process it started are killed when the test
// ends, pass or fail, and the directory goes with the test.
func startChromium(t *testing.T, extra []*os.File, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	harness.Require(t, harness.Chromium)
	dir := t.TempDir()
	cmd := exec.Command("chromium", append(chromiumFlags(filepath.Join(dir, "profile")), args...)...)
	// Its own process group, so that its renderers and helpers die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_CACHE_HOME="+dir)
	cmd.ExtraFiles = extra
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
	})
	return cmd, &out, &errb
}

// chromium runs Chromium once to its end and returns what it printed.
func chromium(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd, out, errb := startChromium(t, nil, args...)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errb.Bytes())
	}
	// Whatever it left running goes now.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return out.Bytes()
}

// domWithoutJavaScript loads url with scripts disabled and returns the
// DOM as the browser holds it. --dump-dom prints nothing with scripts
// off (it reads the DOM with a script), so this asks over the DevTools
// protocol on a pipe (--remote-debugging-pipe: commands in on fd 3,
// answers out on fd 4, each a JSON message ended by a NUL).
func domWithoutJavaScript(t *testing.T, url string) string {
	t.Helper()
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_, _, errb := startChromium(t, []*os.File{cmdR, outW}, "--remote-debugging-pipe", "--blink-settings=scriptEnabled=false", "about:blank")
	cmdR.Close()
	outW.Close()
	defer cmdW.Close()
	defer outR.Close()
	d := newDevtools(cmdW, outR)
	fail := func(err error) { t.Fatalf("DevTools: %v\nchromium: %s", err, errb.Bytes()) }

	var created struct{ TargetID string }
	if err := d.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &created); err != nil {
		fail(err)
	}
	var attached struct{ SessionID string }
	if err := d.call("", "Target.attachToTarget", map[string]any{"targetId": created.TargetID, "flatten": true}, &attached); err != nil {
		fail(err)
	}
	s := attached.SessionID
	if err := d.call(s, "Page.enable", nil, nil); err != nil {
		fail(err)
	}
	if err := d.call(s, "Page.navigate", map[string]any{"url": url}, nil); err != nil {
		fail(err)
	}
	if err := d.waitEvent(s, "Page.loadEventFired"); err != nil {
		fail(err)
	}
	var doc struct{ Root struct{ NodeID int } }
	if err := d.call(s, "DOM.getDocument", map[string]any{"depth": 0}, &doc); err != nil {
		fail(err)
	}
	var html struct{ OuterHTML string }
	if err := d.call(s, "DOM.getOuterHTML", map[string]any{"nodeId": doc.Root.NodeID}, &html); err != nil {
		fail(err)
	}
	_ = d.call("", "Browser.close", nil, nil)
	return html.OuterHTML
}

// devtools speaks the DevTools protocol over Chromium's pipe, one call
// at a time.
type devtools struct {
	w    io.Writer
	r    *bufio.Reader
	next int
}

func newDevtools(w io.Writer, r io.Reader) *devtools {
	return &devtools{w: w, r: bufio.NewReader(r)}
}

type devtoolsMessage struct {
	ID        int             `json:"id,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    any             `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

func (d *devtools) read() (devtoolsMessage, error) {
	raw, err := d.r.ReadBytes(0)
	if err != nil {
		return devtoolsMessage{}, fmt.Errorf("read: %w", err)
	}
	var m devtoolsMessage
	if err := json.Unmarshal(raw[:len(raw)-1], &m); err != nil {
		return m, fmt.Errorf("decode %q: %w", raw, err)
	}
	return m, nil
}

// call sends method and decodes its result into result (nil: ignored),
// skipping the events that come meanwhile.
func (d *devtools) call(session, method string, params, result any) error {
	d.next++
	msg, err := json.Marshal(devtoolsMessage{ID: d.next, SessionID: session, Method: method, Params: params})
	if err != nil {
		return err
	}
	if _, err := d.w.Write(append(msg, 0)); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	for {
		m, err := d.read()
		if err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
		if m.ID != d.next {
			continue
		}
		if m.Error != nil {
			return fmt.Errorf("%s: %s", method, m.Error.Message)
		}
		if result == nil {
			return nil
		}
		return json.Unmarshal(m.Result, result)
	}
}

func (d *devtools) waitEvent(session, method string) error {
	for {
		m, err := d.read()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", method, err)
		}
		if m.Method == method && m.SessionID == session {
			return nil
		}
	}
}

package trace

import (
	"fmt"
	"io"
	"strings"
)

// WriteText prints a trace for a person: one line per step (verdict,
// step, where, what was found), what to do under a step that is not ok,
// and the first broken step at the end.
func WriteText(w io.Writer, r Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s -> %s\n\n", orNone(r.Source), orNone(r.Destination))
	wv, ws, ww := len("VERDICT"), len("STEP"), len("WHERE")
	for _, s := range r.Steps {
		wv, ws, ww = max(wv, len(s.Verdict)), max(ws, len(s.ID)), max(ww, len(s.Where))
	}
	row := func(v, s, where, found string) {
		fmt.Fprintf(&b, "%-*s  %-*s  %-*s  %s\n", wv, v, ws, s, ww, where, found)
	}
	row("VERDICT", "STEP", "WHERE", "FOUND")
	for _, s := range r.Steps {
		row(string(s.Verdict), s.ID, s.Where, s.Found)
		if s.Fix != "" && s.Verdict != OK {
			fmt.Fprintf(&b, "%*s  fix: %s\n", wv, "", s.Fix)
		}
	}
	b.WriteString("\n")
	if r.Broken == "" {
		b.WriteString("No broken step: the path is whole as far as it was read.\n")
	} else {
		for _, s := range r.Steps {
			if s.ID == r.Broken {
				fmt.Fprintf(&b, "First broken step: %s (%s): %s\nWhat to do: %s\n", s.ID, s.Where, s.Found, s.Fix)
				break
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

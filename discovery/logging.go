package discovery

import (
	"context"
	"log"
	"log/slog"
	"strings"
)

// levelWriter turns the "[LEVEL] text" lines of memberlist and mdns into
// slog records.
type levelWriter struct {
	l *slog.Logger
	// suspected, if set, is told the member named when memberlist logs
	// that this member's probe of it failed (notice.go).
	suspected func(name string)
	// refuted, if set, is called when memberlist logs that it refuted
	// an accusation of this member.
	refuted func()
}

func (w levelWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for _, pfx := range []struct {
		tag   string
		level slog.Level
	}{
		{"[DEBUG]", slog.LevelDebug},
		{"[INFO]", slog.LevelDebug},
		{"[WARN]", slog.LevelWarn},
		{"[ERR]", slog.LevelWarn},
		{"[ERROR]", slog.LevelWarn},
	} {
		if i := strings.Index(line, pfx.tag); i >= 0 {
			level = pfx.level
			line = strings.TrimSpace(line[i+len(pfx.tag):])
			break
		}
	}
	if w.suspected != nil {
		if name, ok := suspectLine(line); ok {
			w.suspected(name)
		}
	}
	if w.refuted != nil && refutedLine(line) {
		w.refuted()
	}
	// Refused alive messages are counted and logged by drop, rate-limited.
	// Packets of other mDNS implementations the responder cannot parse
	// (python-zeroconf's NSEC records) arrive every few seconds on a busy
	// LAN and harm nothing but that packet.
	if strings.Contains(line, "ignoring alive message") ||
		strings.Contains(line, "mdns: Failed to unpack packet") || strings.Contains(line, "mdns: Failed to handle query") {
		level = slog.LevelDebug
	}
	w.l.Log(context.Background(), level, line)
	return len(p), nil
}

func memberlistLogger(l *slog.Logger, suspected func(name string), refuted func()) *log.Logger {
	return log.New(levelWriter{l: l.With("lib", "memberlist"), suspected: suspected, refuted: refuted}, "", 0)
}

func mdnsLogger(l *slog.Logger) *log.Logger {
	return log.New(levelWriter{l: l.With("lib", "mdns")}, "", 0)
}

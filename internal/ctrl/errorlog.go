package ctrl

import (
	"context"
	"log/slog"
	"sync"
)

// ErrorLog logs a key's error once per change, and once when it clears:
// a reconcile that fails the same way on every retry says so once.
type ErrorLog[K comparable] struct {
	Logger *slog.Logger
	// Failed is the message of an error ("pod not reflected; retrying");
	// Recovered the message once the key reconciles again, "" for none.
	Failed, Recovered string
	// Attrs names a key in the log ("pod", "ns/name").
	Attrs func(key K) []any
	// Level is an error's level; nil logs every error as a warning.
	Level func(err error) slog.Level

	mu   sync.Mutex
	last map[K]string
}

// Note logs err for key if it differs from key's last one; nil err
// clears it. An error whose level is below Info is transient (a write
// that raced another, a wait): it is logged at that level every time and
// not remembered. A nil ErrorLog notes nothing.
func (l *ErrorLog[K]) Note(key K, err error) {
	if l == nil || l.Logger == nil {
		return
	}
	level := slog.LevelWarn
	if err != nil && l.Level != nil {
		level = l.Level(err)
	}
	if err == nil || level >= slog.LevelInfo {
		if !l.changed(key, err) {
			return
		}
	}
	var attrs []any
	if l.Attrs != nil {
		attrs = l.Attrs(key)
	}
	if err == nil {
		if l.Recovered != "" {
			l.Logger.Info(l.Recovered, attrs...)
		}
		return
	}
	l.Logger.Log(context.Background(), level, l.Failed, append(attrs, "err", err)...)
}

// changed remembers err as key's last error and reports whether it
// differs from the one before.
func (l *ErrorLog[K]) changed(key K, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	was, had := l.last[key]
	if err == nil {
		delete(l.last, key)
		return had
	}
	if had && was == err.Error() {
		return false
	}
	if l.last == nil {
		l.last = map[K]string{}
	}
	l.last[key] = err.Error()
	return true
}

// Named is an ErrorLog's Attrs that logs the key itself under attr.
func Named[K comparable](attr string) func(K) []any {
	return func(key K) []any { return []any{attr, key} }
}

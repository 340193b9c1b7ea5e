package eventstream

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
)

// A stream that keeps ending waits twice as long each time, up to
// resubscribeMax; one that stayed open past streamSettled starts over.
func TestResubscribeBackoff(t *testing.T) {
	w := &Watcher{Hooks: Hooks{Log: slog.New(slog.DiscardHandler), Lost: func() {}}}
	s := &Stream{Kind: "route", cancel: func() {}}
	var got []time.Duration
	for range 9 {
		s.opened = time.Now()
		w.streamEnded(s, nil)
		got = append(got, time.Until(s.retryAt).Round(50*time.Millisecond))
	}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
	s.opened = time.Now().Add(-streamSettled)
	w.streamEnded(s, nil)
	if d := time.Until(s.retryAt).Round(50 * time.Millisecond); d != resubscribeFirst {
		t.Errorf("wait after a settled stream ended: %s, want %s", d, resubscribeFirst)
	}
}

// A stream that ends is opened again and counted, its owner is told to
// read back twice (at the end and once open again), and the same trouble
// is logged once however often it recurs.
func TestWatchReopens(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	opens := make(chan func(error), 8)
	sub := func(ctx context.Context, wg *sync.WaitGroup, ended func(error)) error {
		opens <- ended
		return nil
	}
	var mu sync.Mutex
	var reopened, warned int
	lost := make(chan struct{}, 8)
	log := slog.New(handlerFunc(func(r slog.Record) {
		mu.Lock()
		defer mu.Unlock()
		if r.Level == slog.LevelWarn {
			warned++
		}
	}))
	h := Hooks{Log: log,
		Lost:     func() { lost <- struct{}{} },
		Reopened: func(string) { mu.Lock(); reopened++; mu.Unlock() }}
	w, err := Watch(ctx, &wg, []*Stream{{Kind: "test", Subscribe: sub}}, h)
	if err != nil {
		t.Fatal(err)
	}
	// The owner's loop.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.Wake():
				w.Tend(ctx, &wg)
			}
		}
	}()
	for i := range 2 {
		(<-opens)(errors.New("no buffer space available"))
		<-lost // at the end
		<-lost // once open again
		mu.Lock()
		if reopened != i+1 || warned != 1 {
			t.Errorf("after end %d: reopened %d, warned %d; want %d, 1", i+1, reopened, warned, i+1)
		}
		mu.Unlock()
	}
}

// A stream that cannot be opened at first fails Watch, naming the stream.
func TestWatchFailsToOpen(t *testing.T) {
	var wg sync.WaitGroup
	sub := func(context.Context, *sync.WaitGroup, func(error)) error { return errors.New("permission denied") }
	_, err := Watch(context.Background(), &wg, []*Stream{{Kind: "nftables", Subscribe: sub}}, Hooks{})
	if err == nil || err.Error() != "subscribe to nftables events: permission denied" {
		t.Errorf("Watch = %v", err)
	}
	wg.Wait()
}

type handlerFunc func(slog.Record)

func (h handlerFunc) Enabled(context.Context, slog.Level) bool      { return true }
func (h handlerFunc) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h handlerFunc) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h handlerFunc) WithGroup(string) slog.Handler                 { return h }

// A change concerns our table when it names it; set element events name
// no table, so every one may.
func TestMayConcern(t *testing.T) {
	ours, theirs := &nftables.Table{Name: "flotilla"}, &nftables.Table{Name: "other"}
	for _, tc := range []struct {
		name string
		data any
		want bool
	}{
		{"our table", ours, true},
		{"another table", theirs, false},
		{"our chain", &nftables.Chain{Table: ours}, true},
		{"another's chain", &nftables.Chain{Table: theirs}, false},
		{"chain without table", &nftables.Chain{}, false},
		{"our rule", &nftables.Rule{Table: ours}, true},
		{"another's rule", &nftables.Rule{Table: theirs}, false},
		{"our set", &nftables.Set{Table: ours}, true},
		{"another's set", &nftables.Set{Table: theirs}, false},
		{"set elements", []nftables.SetElement{{Key: []byte{1, 2, 3, 4}}}, true},
		{"something else", &nftables.GenMsg{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MayConcern(&nftables.MonitorEvent{Data: tc.data}, "flotilla"); got != tc.want {
				t.Errorf("MayConcern = %v, want %v", got, tc.want)
			}
		})
	}
}

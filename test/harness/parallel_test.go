package harness

import (
	"testing"
	"time"
)

func TestSlotsAdmitAtMostTheirNumber(t *testing.T) {
	dir := t.TempDir()
	first, err := takeSlot(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	second, err := takeSlot(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	third := make(chan func(), 1)
	go func() {
		release, err := takeSlot(dir, 2)
		if err != nil {
			t.Error(err)
			release = func() {}
		}
		third <- release
	}()
	// A take of a third slot with room for three returns at once: the
	// witness that the second of two is held, not slow.
	extra, err := takeSlot(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	extra()
	select {
	case release := <-third:
		release()
		t.Fatal("a third test took one of two slots while both were held")
	case <-time.After(time.Second):
	}
	first()
	select {
	case release := <-third:
		release()
	case <-time.After(time.Minute):
		t.Fatal("a freed slot was not taken within a minute")
	}
	second()
}

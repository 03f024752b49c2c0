package backoff

import (
	"testing"
	"time"
)

func TestNextDoublesUpToMax(t *testing.T) {
	b := New(10*time.Millisecond, 35*time.Millisecond)
	want := []time.Duration{10, 20, 35, 35}
	for i, w := range want {
		if got := b.Next(); got != w*time.Millisecond {
			t.Fatalf("pause %d = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	b.Reset()
	if got := b.Next(); got != 10*time.Millisecond {
		t.Fatalf("after Reset: %v, want 10ms", got)
	}
}

// A first pause above the cap is kept once, as the loops it replaced did.
func TestFirstAboveMax(t *testing.T) {
	b := New(2*time.Second, time.Second)
	if a, c := b.Next(), b.Next(); a != 2*time.Second || c != time.Second {
		t.Fatalf("pauses %v, %v; want 2s, 1s", a, c)
	}
}

func TestJitteredWithinHalfAndOneAndAHalf(t *testing.T) {
	for range 1000 {
		b := New(100*time.Millisecond, time.Second)
		if d := b.Jittered(); d < 50*time.Millisecond || d >= 150*time.Millisecond {
			t.Fatalf("jittered pause %v outside [50ms, 150ms)", d)
		}
	}
	var zero Backoff
	if d := zero.Jittered(); d != 0 {
		t.Fatalf("zero Backoff: %v", d)
	}
}

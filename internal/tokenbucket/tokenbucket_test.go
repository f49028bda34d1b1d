package tokenbucket

import (
	"testing"
	"time"
)

// TestLaneFloodingPastItsBurstWaitsForItsRate: a lane that asks without
// pause gets its burst at once, then one event every 1/rate, told each
// time how long until the next; the waits it is told add up to what the
// rate allows, never less.
func TestLaneFloodingPastItsBurstWaitsForItsRate(t *testing.T) {
	for _, c := range []struct {
		name         string
		rate, burst  int
		asks         int // asked at one instant
		wantAdmitted int
		wantWait     time.Duration
	}{
		{"100 a second, burst 200: 1000 asked at once", 100, 200, 1000, 200, 10 * time.Millisecond},
		{"1 a second, burst 1: 5 asked at once", 1, 1, 5, 1, time.Second},
		{"3 a second, burst 10: exactly its burst", 3, 10, 10, 10, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := New(c.rate, c.burst)
			t0 := time.Unix(1000, 0)
			admitted := 0
			var wait time.Duration
			for range c.asks {
				ok, w := b.Take(t0)
				if ok {
					admitted++
					continue
				}
				if w <= 0 {
					t.Fatalf("refused with a wait of %v: a caller that waits would spin", w)
				}
				wait = w
			}
			if admitted != c.wantAdmitted || wait != c.wantWait {
				t.Fatalf("admitted %d, told to wait %v; want %d and %v", admitted, wait, c.wantAdmitted, c.wantWait)
			}
			if c.wantWait == 0 {
				return
			}
			// Waiting as told, then asking again without pause for a
			// second: about rate more, never more.
			now := t0
			more := 0
			for now.Sub(t0) < time.Second {
				ok, w := b.Take(now)
				if ok {
					more++
					continue
				}
				now = now.Add(w)
			}
			if more > c.rate || more < c.rate-1 {
				t.Fatalf("a second of asking after the burst admitted %d, want %d", more, c.rate)
			}
		})
	}
}

// TestLaneIdleLongGetsOnlyItsBurst: however long a lane was idle, it may
// then make only burst events at once, not what the idle time would have
// earned.
func TestLaneIdleLongGetsOnlyItsBurst(t *testing.T) {
	b := New(100, 50)
	t0 := time.Unix(1000, 0)
	for range 50 {
		b.Take(t0)
	}
	later := t0.Add(24 * time.Hour)
	n := 0
	for {
		if ok, _ := b.Take(later); !ok {
			break
		}
		n++
	}
	if n != 50 {
		t.Fatalf("after a day idle it took %d at once, want its burst of 50", n)
	}
}

// TestClockGoingBackMintsNoTokens: a clock that steps back (or a caller
// that passes an old time) earns nothing, and the time after it counts
// only from the latest time seen.
func TestClockGoingBackMintsNoTokens(t *testing.T) {
	b := New(10, 1)
	t0 := time.Unix(1000, 0)
	if ok, _ := b.Take(t0); !ok {
		t.Fatal("a full bucket refused its first event")
	}
	if ok, _ := b.Take(t0.Add(-time.Hour)); ok {
		t.Fatal("an hour back in time gave a token")
	}
	if ok, _ := b.Take(t0.Add(50 * time.Millisecond)); ok {
		t.Fatal("50 ms after the latest time seen gave a token at 10 a second")
	}
	if ok, _ := b.Take(t0.Add(100 * time.Millisecond)); !ok {
		t.Fatal("100 ms after the last token gave none at 10 a second")
	}
}

// TestZeroLimitsStillAdmit: limits under 1 are taken as 1, so a bucket
// made from a bad value refuses nothing for ever.
func TestZeroLimitsStillAdmit(t *testing.T) {
	b := New(0, 0)
	if b.Rate() != 1 || b.Burst() != 1 {
		t.Fatalf("rate %d burst %d, want 1 and 1", b.Rate(), b.Burst())
	}
	t0 := time.Unix(1000, 0)
	if ok, _ := b.Take(t0); !ok {
		t.Fatal("refused its first event")
	}
	if ok, _ := b.Take(t0.Add(time.Second)); !ok {
		t.Fatal("refused a second later")
	}
}

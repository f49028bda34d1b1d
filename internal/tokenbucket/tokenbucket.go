// Package tokenbucket bounds how fast one lane or agent may make the rig
// work for it: the harness API's accepts on each role's own listener and
// each role's requests (the controller). A bucket decides; its owner
// waits or refuses, so the decision is a pure function of the bucket and
// the time, tested without a clock.
package tokenbucket

import (
	"math"
	"time"
)

// Bucket holds up to burst tokens and gains rate of them a second; each
// event takes one. A lane idle for a while may therefore make burst
// events at once, and then rate a second however it tries. A Bucket is
// not safe for concurrent use: its owner holds its own lock around each
// call.
type Bucket struct {
	rate   float64 // tokens a second
	burst  float64 // the most it holds
	tokens float64
	last   time.Time // when tokens was last brought up to date
}

// New is a full bucket of burst tokens that gains rate a second; rate and
// burst under 1 are taken as 1, so no bucket refuses for ever.
func New(rate, burst int) *Bucket {
	b := &Bucket{rate: float64(max(rate, 1)), burst: float64(max(burst, 1))}
	b.tokens = b.burst
	return b
}

// Rate and Burst are the bucket's limits, for the lines that name them.
func (b *Bucket) Rate() int  { return int(b.rate) }
func (b *Bucket) Burst() int { return int(b.burst) }

// Take decides whether one more event may happen at now: it takes a
// token and returns true, or returns false and how long until a token
// is there (never less than a millisecond, so a caller that waits
// cannot spin). A clock that goes back gives no tokens: only time after
// the latest seen counts.
func (b *Bucket) Take(now time.Time) (ok bool, wait time.Duration) {
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	need := (1 - b.tokens) / b.rate
	wait = time.Duration(math.Ceil(need * float64(time.Second)))
	return false, max(wait, time.Millisecond)
}

// refill adds what the time since the last refill earned, up to burst.
func (b *Bucket) refill(now time.Time) {
	if b.last.IsZero() {
		b.last = now
		return
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.last = now
	}
}

package controller

import (
	"testing"

	"thermite/internal/tokenbucket"
)

// TestLaneFloodingPastItsRateIsOneLogLine: a lane asking 1,000 times at
// once past a bucket of one is turned away 999 times, each told to wait,
// and the controller's log gets one line for all of them (the first),
// not one a refusal: a flood must not turn into a flood of the log.
func TestLaneFloodingPastItsRateIsOneLogLine(t *testing.T) {
	p := pacedBucket{bucket: tokenbucket.New(1, 1)}
	lines, admitted := 0, 0
	for range 1000 {
		wait, ok := p.take(func(_ *tokenbucket.Bucket, over int) {
			lines++
			if over != 1 {
				t.Errorf("the first line counts %d turned away, want 1", over)
			}
		})
		if ok {
			admitted++
		} else if wait <= 0 {
			t.Fatalf("turned away with a wait of %v", wait)
		}
	}
	if admitted != 1 || lines != 1 || p.over != 998 {
		t.Fatalf("admitted %d, log lines %d, turned away since the line %d; want 1, 1, 998 (the first said in its line)", admitted, lines, p.over)
	}
}

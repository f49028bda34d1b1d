// Package fairshare is a budget that many holders draw on, kept so that
// no holder's use can take another's: the harness API's connections and
// request bodies (the controller), the broker's inotify watches (the disk
// measure). The controller and the broker share it here, as they share
// nothing else but internal/.
package fairshare

// Share is a budget divided among holders: each possible holder is
// guaranteed a floor of its own, and only what is left after every floor
// (the pool) is first come, first served. One holder at its cap therefore
// costs the others nothing. A Share is not safe for concurrent use: its
// owner holds its own lock around each call.
type Share struct {
	max       int64 // all holders together
	perHolder int64 // one holder's cap
	floor     int64 // what each holder is guaranteed
	pool      int64 // max less every floor: what holders above their floor share
	borrowed  int64 // what holders hold above their floors, all together
	sum       int64 // what all holders hold
	held      map[string]int64
}

// New divides all among holders: each is guaranteed min(perHolder,
// all/holders). When that is less than unit (the largest single draw, or
// the most one holder uses at once), a holder could never make its
// largest draw from its floor alone, so only half of all is divided into
// floors and the other half is the pool the largest draws come from.
func New(all, perHolder, unit int64, holders int) *Share {
	holders = max(holders, 1)
	floor := min(perHolder, all/int64(holders))
	if floor < unit {
		floor = min(perHolder, all/2/int64(holders))
	}
	return &Share{max: all, perHolder: perHolder, floor: floor, pool: all - floor*int64(holders), held: map[string]int64{}}
}

// Admit decides whether who may take n more: within its own cap, what it
// would hold above its floor within what is left of the pool, and
// everything within max (which only more holders than were counted can
// reach). It returns ok, or whether the refusal is of who's own cap
// (true) or of what others hold (false).
func (f *Share) Admit(who string, n int64) (ok, ownCap bool) {
	had := f.held[who]
	now := had + n
	if now > f.perHolder {
		return false, true
	}
	more := max(now-f.floor, 0) - max(had-f.floor, 0)
	if (more > 0 && f.borrowed+more > f.pool) || f.sum+n > f.max {
		return false, false
	}
	f.held[who] = now
	f.borrowed += more
	f.sum += n
	return true, false
}

// Release gives n of who's back.
func (f *Share) Release(who string, n int64) {
	had := f.held[who]
	now := max(had-n, 0)
	f.borrowed -= max(had-f.floor, 0) - max(now-f.floor, 0)
	f.sum -= had - now
	if now == 0 {
		delete(f.held, who)
	} else {
		f.held[who] = now
	}
}

// Held is what who holds now.
func (f *Share) Held(who string) int64 { return f.held[who] }

// Holders is how many hold anything now.
func (f *Share) Holders() int { return len(f.held) }

// Sum is what all holders hold now; Borrowed what they hold above their
// floors.
func (f *Share) Sum() int64      { return f.sum }
func (f *Share) Borrowed() int64 { return f.borrowed }

// Max, PerHolder, Floor and Pool are the budget's sizes, for the lines
// that refuse a draw.
func (f *Share) Max() int64       { return f.max }
func (f *Share) PerHolder() int64 { return f.perHolder }
func (f *Share) Floor() int64     { return f.floor }
func (f *Share) Pool() int64      { return f.pool }

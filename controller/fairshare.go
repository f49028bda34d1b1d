package controller

// fairShare is a budget that many holders draw on (the lanes' trials for
// the API's request bodies, the roles' uids for its connections), kept so
// that no holder's use can take another's: each possible holder is
// guaranteed a floor of its own, and only what is left after every floor
// (the pool) is first come, first served. One lane at its cap therefore
// costs the others nothing, and the operator (one of the holders) always
// has its floor.
type fairShare struct {
	max       int64 // all holders together
	perHolder int64 // one holder's cap
	floor     int64 // what each holder is guaranteed
	pool      int64 // max less every floor: what holders above their floor share
	borrowed  int64 // what holders hold above their floors, all together
	sum       int64 // what all holders hold
	held      map[string]int64
}

// newFairShare divides all among holders: each is guaranteed
// min(perHolder, all/holders). When that is less than unit (the largest
// single draw, a whole body), a holder could never make its largest draw
// from its floor alone, so only half of all is divided into floors and the
// other half is the pool the largest draws come from.
func newFairShare(all, perHolder, unit int64, holders int) *fairShare {
	holders = max(holders, 1)
	floor := min(perHolder, all/int64(holders))
	if floor < unit {
		floor = min(perHolder, all/2/int64(holders))
	}
	return &fairShare{max: all, perHolder: perHolder, floor: floor, pool: all - floor*int64(holders), held: map[string]int64{}}
}

// admitShare decides whether who may take n more: within its own cap,
// what it would hold above its floor within what is left of the pool, and
// everything within max (which only more holders than were counted can
// reach). It returns ok, or whether the refusal is of who's own cap
// (true) or of what others hold (false).
func (f *fairShare) admitShare(who string, n int64) (ok, ownCap bool) {
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

// releaseShare gives n of who's back.
func (f *fairShare) releaseShare(who string, n int64) {
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

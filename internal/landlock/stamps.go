package landlock

import "golang.org/x/sys/unix"

// Stamp is what a walked folder looked like: a change to its entries
// changes its mtime and ctime.
type Stamp struct {
	Path  string
	Ino   uint64
	Mtime unix.Timespec
	Ctime unix.Timespec
}

// Stamps records the folders a rule set was built from.
func Stamps(dirs []string) []Stamp {
	out := make([]Stamp, 0, len(dirs))
	for _, d := range dirs {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil {
			out = append(out, Stamp{d, st.Ino, st.Mtim, st.Ctim})
		} else {
			out = append(out, Stamp{Path: d})
		}
	}
	return out
}

// Stale reports the first folder that changed since its stamp.
func Stale(stamps []Stamp) string {
	for _, s := range stamps {
		var st unix.Stat_t
		if unix.Stat(s.Path, &st) != nil || st.Ino != s.Ino || st.Mtim != s.Mtime || st.Ctim != s.Ctime {
			return s.Path
		}
	}
	return ""
}

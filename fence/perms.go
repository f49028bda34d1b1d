package fence

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// NodeMode is the mode of every GPU device file the layout places.
const NodeMode = 0o660

// Want is the owner, group and mode a device file should have.
type Want struct {
	Path string
	GID  int
	Mode uint32
}

// Wanted lists each GPU device file with the group and mode the layout
// gives it: a placed card root:<its group> 0660, the control nodes
// root:gpu 0660, and, on a refused layout, everything root:root 0600.
func (l *Layout) Wanted(gid func(group string) (int, bool)) []Want {
	var out []Want
	ctl, ctlOK := gid(ControlGroup)
	for _, c := range l.Cards {
		g, ok := gid(l.Group[c.Index])
		if l.Refused != "" || !ok {
			out = append(out, Want{c.Path, 0, 0o600})
			continue
		}
		out = append(out, Want{c.Path, g, NodeMode})
	}
	for _, p := range l.Control {
		if l.Refused != "" || !ctlOK {
			out = append(out, Want{p, 0, 0o600})
			continue
		}
		out = append(out, Want{p, ctl, NodeMode})
	}
	return out
}

// FixPermissions puts each device file's owner, group and mode back. It
// says whether they all now are as wanted and, when not, names the first
// that would not change: some containers (RunPod) keep the nodes as they
// came, open to everyone, and then the fence alone keeps roles off them.
func FixPermissions(wants []Want) (fixed bool, note string) {
	fixed = true
	for _, w := range wants {
		fd, err := unix.Open(w.Path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone: rediscovery will see it
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			unix.Close(fd)
			continue
		}
		cerr := unix.Fchownat(fd, "", 0, w.GID, unix.AT_EMPTY_PATH)
		merr := unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), w.Mode)
		unix.Fstat(fd, &st)
		unix.Close(fd)
		if st.Uid != 0 || int(st.Gid) != w.GID || st.Mode&0o7777 != w.Mode {
			if fixed {
				why := "they did not change"
				if cerr != nil {
					why = "chown: " + cerr.Error()
				} else if merr != nil {
					why = "chmod: " + merr.Error()
				}
				note = fmt.Sprintf("device permissions cannot be changed in this container (%s is %d:%d %04o, want 0:%d %04o: %s): the fence alone keeps roles off the cards",
					w.Path, st.Uid, st.Gid, st.Mode&0o7777, w.GID, w.Mode, why)
			}
			fixed = false
		}
	}
	return fixed, note
}

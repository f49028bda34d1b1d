// Package mountinfo reads /proc/PID/mountinfo (proc(5)), which both the
// cgroup set-up (where each hierarchy is mounted) and the disk quotas
// (which mount a device is) need: one parser and one unescape.
package mountinfo

import (
	"strconv"
	"strings"
)

// Mount is one line of mountinfo:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
type Mount struct {
	Device  string   // major:minor of the file system's device
	Root    string   // the path inside the file system that is mounted ("/" usually)
	Point   string   // where it is mounted
	Options []string // per-mount options (rw, ro, nosuid, ...)
	Type    string   // ext4, tmpfs, cgroup, cgroup2, ...
	Source  string   // the device or what stands for it (/dev/sda1, tmpfs)
	Super   []string // super options: for cgroup v1, the controllers
}

// Parse returns the mounts that s describes, in its order, less the lines
// that are not whole (six fields, the separator, a type and a source).
func Parse(s string) []Mount {
	var out []Mount
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(f) {
			continue
		}
		m := Mount{
			Device:  f[2],
			Root:    Unescape(f[3]),
			Point:   Unescape(f[4]),
			Options: strings.Split(f[5], ","),
			Type:    f[sep+1],
			Source:  Unescape(f[sep+2]),
		}
		if sep+3 < len(f) {
			m.Super = strings.Split(f[sep+3], ",")
		}
		out = append(out, m)
	}
	return out
}

// Unescape undoes the octal escapes (\040 for a space) of mountinfo's
// paths.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

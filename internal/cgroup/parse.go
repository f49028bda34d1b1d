package cgroup

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"thermite/internal/mountinfo"
)

// mount is one line of /proc/self/mountinfo, the fields this package needs.
type mount struct {
	root   string   // the path inside the filesystem that is mounted ("/" usually)
	point  string   // where it is mounted
	fstype string   // cgroup, cgroup2, tmpfs, ...
	opts   []string // per-mount options (rw, ro, nosuid, ...)
	super  []string // super options: for cgroup v1, the controllers
}

// parseMountinfo reads /proc/self/mountinfo, the fields this package
// needs.
func parseMountinfo(s string) []mount {
	var out []mount
	for _, m := range mountinfo.Parse(s) {
		out = append(out, mount{root: m.Root, point: m.Point, fstype: m.Type, opts: m.Options, super: m.Super})
	}
	return out
}

// notControllers are the v1 super options that are not controller names.
var notControllers = map[string]bool{
	"rw": true, "ro": true, "clone_children": true, "noprefix": true,
	"xattr": true, "cpuset_v2_mode": true, "none": true, "all": true,
	"favordynmods": true, "nsdelegate": true, "memory_recursiveprot": true,
	"memory_localevents": true, "memory_hugetlb_accounting": true,
	"pids_localevents": true,
}

// v1Controllers returns the controllers a cgroup v1 mount carries, from its
// super options; a named hierarchy is "name=systemd".
func (m mount) v1Controllers() []string {
	var out []string
	for _, o := range m.super {
		if notControllers[o] || strings.HasPrefix(o, "release_agent=") {
			continue
		}
		out = append(out, o)
	}
	return out
}

func (m mount) readOnly() bool {
	for _, o := range m.opts {
		if o == "ro" {
			return true
		}
	}
	return false
}

// selfCgroup is one line of /proc/self/cgroup: "4:memory:/a/b" (v1) or
// "0::/a/b" (v2).
type selfCgroup struct {
	controllers []string // empty for the v2 line
	path        string
}

func parseSelfCgroup(s string) []selfCgroup {
	var out []selfCgroup
	for _, line := range strings.Split(s, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		c := selfCgroup{path: parts[2]}
		if parts[1] != "" {
			c.controllers = strings.Split(parts[1], ",")
		}
		out = append(out, c)
	}
	return out
}

// selfPath returns this process's cgroup path in the v1 hierarchy that
// carries controller, or, for controller "", the v2 path.
func selfPath(lines []selfCgroup, controller string) (string, bool) {
	for _, l := range lines {
		if controller == "" {
			if len(l.controllers) == 0 {
				return l.path, true
			}
			continue
		}
		for _, c := range l.controllers {
			if c == controller {
				return l.path, true
			}
		}
	}
	return "", false
}

// ownDir maps this process's cgroup path (as /proc/self/cgroup gives it)
// to a directory under the mount m, which shows the part of the hierarchy
// below m.root. ok is false when the group is not visible under the mount
// (then the caller falls back to the mount's top).
func ownDir(m mount, self string) (string, bool) {
	self = path.Clean("/" + self)
	root := path.Clean("/" + m.root)
	rel := ""
	switch {
	case root == "/":
		rel = self
	case self == root:
		rel = "/"
	case strings.HasPrefix(self, root+"/"):
		rel = strings.TrimPrefix(self, root)
	default:
		return m.point, false
	}
	return path.Join(m.point, rel), true
}

// keyed parses a flat keyed file ("oom 0\noom_kill 2\n") into its values.
func keyed(s string) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			out[f[0]] = v
		}
	}
	return out
}

// parseValue parses a single-value file: a number, or "max" (returned as
// -1).
func parseValue(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number: %q", s)
	}
	return v, nil
}

// parsePids parses cgroup.procs: one pid a line.
func parsePids(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Fields(s) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("not a pid: %q", f)
		}
		out = append(out, pid)
	}
	return out, nil
}

func sortedUnique(xs []int) []int {
	sort.Ints(xs)
	out := xs[:0]
	for i, x := range xs {
		if i == 0 || x != xs[i-1] {
			out = append(out, x)
		}
	}
	return out
}

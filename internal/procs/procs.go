// Package procs reads /proc: which processes a uid runs, and the fields of
// a process's status file.
package procs

import (
	"bytes"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ByUID returns the pids whose real uid is uid, from procRoot ("/proc").
// It is a snapshot for reporting: stopping a user never relies on it.
func ByUID(procRoot string, uid int) ([]int, error) {
	m, err := CountByUID(procRoot, map[int]bool{uid: true})
	if err != nil {
		return nil, err
	}
	return m[uid], nil
}

// CountByUID returns, for each uid in uids, the pids whose real uid it is.
func CountByUID(procRoot string, uids map[int]bool) (map[int][]int, error) {
	out := map[int][]int{}
	err := eachProcess(procRoot, func(string) bool { return true }, func(pid, uid int) {
		if uids[uid] {
			out[uid] = append(out[uid], pid)
		}
	})
	return out, err
}

// eachProcess calls found with the pid and real uid of every process but
// this one whose /proc entry name passes want.
func eachProcess(procRoot string, want func(entry string) bool, found func(pid, uid int)) error {
	d, err := os.Open(procRoot)
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	self := os.Getpid()
	buf := make([]byte, 4096)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self || !want(procRoot+"/"+n) {
			continue
		}
		if uid, ok := realUID(procRoot+"/"+n+"/status", buf); ok {
			found(pid, uid)
		}
	}
	return nil
}

// ByUIDOwned is ByUID for users that cannot change their effective uid
// (no capability, no_new_privs: a role): it reads the status only of
// processes whose /proc entry is uid's or root's. The kernel gives the
// entry the effective uid of a dumpable process and root to one that is
// not dumpable, so a process of uid is one or the other; a stat costs a
// fraction of generating the status, which every other process of the
// machine would otherwise cost each call.
func ByUIDOwned(procRoot string, uid int) ([]int, error) {
	var out []int
	owned := func(entry string) bool {
		var st unix.Stat_t
		return unix.Stat(entry, &st) == nil && (st.Uid == uint32(uid) || st.Uid == 0)
	}
	err := eachProcess(procRoot, owned, func(pid, u int) {
		if u == uid {
			out = append(out, pid)
		}
	})
	return out, err
}

func realUID(path string, buf []byte) (int, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	n, _ := f.Read(buf)
	f.Close()
	b := buf[:n]
	i := bytes.Index(b, []byte("\nUid:\t"))
	if i < 0 {
		return 0, false
	}
	b = b[i+6:]
	j := bytes.IndexAny(b, "\t\n")
	if j < 0 {
		return 0, false
	}
	uid, err := strconv.Atoi(string(b[:j]))
	return uid, err == nil
}

// Status reads a /proc/<pid>/status file into its fields.
func Status(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out, nil
}

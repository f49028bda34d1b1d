package roles

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Shell is every role user's login shell: nobody logs in as a role.
const Shell = "/usr/sbin/nologin"

// Home is every role user's home in /etc/passwd. Its real HOME, in scratch,
// comes with each command's environment.
const Home = "/nonexistent"

// entry is one colon-separated line of a database file.
type entry []string

type dbFile struct {
	path   string
	fields int // how many fields a well-formed line has
	lines  []string
	mode   os.FileMode
	uid    int
	gid    int
	dirty  bool
}

func readDB(path string, fields int, optional bool) (*dbFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		if optional && os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("roles: %w", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("roles: %w", err)
	}
	f := &dbFile{path: path, fields: fields, mode: st.Mode().Perm()}
	sys := st.Sys().(*syscall.Stat_t)
	f.uid, f.gid = int(sys.Uid), int(sys.Gid)
	text := strings.TrimSuffix(string(data), "\n")
	if text != "" {
		f.lines = strings.Split(text, "\n")
	}
	return f, nil
}

// find returns the index of the line whose first field is name, or -1.
func (f *dbFile) find(name string) int {
	for i, l := range f.lines {
		if n, _, ok := strings.Cut(l, ":"); ok && n == name {
			return i
		}
	}
	return -1
}

// findID returns the index of the first line whose third field is id, or -1.
func (f *dbFile) findID(id int) int {
	s := strconv.Itoa(id)
	for i, l := range f.lines {
		e := strings.Split(l, ":")
		if len(e) >= 3 && e[2] == s {
			return i
		}
	}
	return -1
}

func (f *dbFile) get(i int) entry { return strings.Split(f.lines[i], ":") }

func (f *dbFile) set(i int, e entry) {
	l := strings.Join(e, ":")
	if f.lines[i] != l {
		f.lines[i] = l
		f.dirty = true
	}
}

func (f *dbFile) add(e entry) {
	f.lines = append(f.lines, strings.Join(e, ":"))
	f.dirty = true
}

func (f *dbFile) remove(i int) {
	f.lines = append(f.lines[:i], f.lines[i+1:]...)
	f.dirty = true
}

// write replaces the file atomically: a temporary file beside it with the
// same owner and mode, fsynced, renamed over it, and the folder fsynced.
func (f *dbFile) write() error {
	if f == nil || !f.dirty {
		return nil
	}
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.path)+".thermite-*")
	if err != nil {
		return fmt.Errorf("roles: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	var b bytes.Buffer
	for _, l := range f.lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	if err := tmp.Chmod(f.mode); err != nil {
		return fmt.Errorf("roles: %s: %w", f.path, err)
	}
	if err := tmp.Chown(f.uid, f.gid); err != nil {
		return fmt.Errorf("roles: %s: %w", f.path, err)
	}
	if _, err := tmp.Write(b.Bytes()); err != nil {
		return fmt.Errorf("roles: %s: %w", f.path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("roles: %s: %w", f.path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("roles: %s: %w", f.path, err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("roles: %s: %w", f.path, err)
	}
	ok = true
	d, err := os.Open(dir)
	if err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// lockDB takes the lock shadow-utils' lckpwdf takes, so that useradd and a
// second thermite never interleave their edits with ours.
func lockDB(etc string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(etc, ".pwd.lock"), os.O_WRONLY|os.O_CREATE|unix.O_CLOEXEC, 0600)
	if err != nil {
		return nil, fmt.Errorf("roles: lock: %w", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	deadline := time.Now().Add(15 * time.Second)
	for {
		err = unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("roles: lock %s: held by another program for 15s", f.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() {
		lk.Type = unix.F_UNLCK
		unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk)
		f.Close()
	}, nil
}

type dbs struct{ passwd, group, shadow, gshadow *dbFile }

func readDBs(etc string) (*dbs, error) {
	var d dbs
	var err error
	if d.passwd, err = readDB(filepath.Join(etc, "passwd"), 7, false); err != nil {
		return nil, err
	}
	if d.group, err = readDB(filepath.Join(etc, "group"), 4, false); err != nil {
		return nil, err
	}
	if d.shadow, err = readDB(filepath.Join(etc, "shadow"), 9, true); err != nil {
		return nil, err
	}
	if d.gshadow, err = readDB(filepath.Join(etc, "gshadow"), 4, true); err != nil {
		return nil, err
	}
	return &d, nil
}

func (d *dbs) write() error {
	// Shadow files first: a user that shows in passwd has its locked entry.
	for _, f := range []*dbFile{d.shadow, d.gshadow, d.group, d.passwd} {
		if err := f.write(); err != nil {
			return err
		}
	}
	return nil
}

// changeDBs reads etc's account databases under their lock, lets change
// edit them, and writes them back unless it fails: every change to them
// (Ensure's, Remove's) goes this way. It returns what change says it did.
func changeDBs(etc string, change func(d *dbs) ([]string, error)) ([]string, error) {
	unlock, err := lockDB(etc)
	if err != nil {
		return nil, err
	}
	defer unlock()
	d, err := readDBs(etc)
	if err != nil {
		return nil, err
	}
	done, err := change(d)
	if err != nil {
		return nil, err
	}
	return done, d.write()
}

// Ensure writes the table's users and groups that are missing into etc's
// passwd, group, shadow and gshadow, and puts back the fields of those that
// drifted. It refuses, naming both, when a role's name exists with another
// id or its id belongs to another name, and then writes nothing.
func (t *Table) Ensure(etc string) (added []string, err error) {
	return changeDBs(etc, t.ensureIn)
}

// ensureIn is Ensure on the databases read: what it added.
func (t *Table) ensureIn(d *dbs) (added []string, err error) {
	if err := t.checkConflicts(d); err != nil {
		return nil, err
	}
	days := strconv.FormatInt(time.Now().Unix()/86400, 10)
	groupMembers := map[int][]string{}
	for _, g := range t.Groups {
		groupMembers[g.GID] = g.Members
	}
	type grp struct {
		name string
		gid  int
	}
	var groups []grp
	for _, r := range t.Roles {
		groups = append(groups, grp{r.User, r.GID})
	}
	for _, g := range t.Groups {
		groups = append(groups, grp{g.Unix, g.GID})
	}
	for _, g := range groups {
		members := strings.Join(groupMembers[g.gid], ",")
		want := entry{g.name, "x", strconv.Itoa(g.gid), members}
		if i := d.group.find(g.name); i >= 0 {
			d.group.set(i, want)
		} else {
			d.group.add(want)
			added = append(added, "group "+g.name)
		}
		if d.gshadow != nil {
			want := entry{g.name, "!", "", members}
			if i := d.gshadow.find(g.name); i >= 0 {
				d.gshadow.set(i, want)
			} else {
				d.gshadow.add(want)
			}
		}
	}
	for _, r := range t.Roles {
		want := entry{r.User, "x", strconv.Itoa(r.UID), strconv.Itoa(r.GID), "thermite " + r.Name, Home, Shell}
		if i := d.passwd.find(r.User); i >= 0 {
			d.passwd.set(i, want)
		} else {
			d.passwd.add(want)
			added = append(added, "user "+r.User)
		}
		if d.shadow != nil {
			if i := d.shadow.find(r.User); i >= 0 {
				e := d.shadow.get(i)
				if len(e) < 2 || e[1] != "!" {
					// Whatever password it had, a role's is locked.
					e = entry{r.User, "!", days, "0", "99999", "7", "", "", ""}
					d.shadow.set(i, e)
				}
			} else {
				d.shadow.add(entry{r.User, "!", days, "0", "99999", "7", "", "", ""})
			}
		}
	}
	// No role user is a member of any group the table does not give it.
	ours := map[string]bool{}
	for _, r := range t.Roles {
		ours[r.User] = true
	}
	tableGroups := map[string]bool{}
	for _, g := range groups {
		tableGroups[g.name] = true
	}
	for _, f := range []*dbFile{d.group, d.gshadow} {
		if f == nil {
			continue
		}
		for i := range f.lines {
			e := f.get(i)
			if len(e) < 4 || tableGroups[e[0]] || e[3] == "" {
				continue
			}
			var keep []string
			for _, m := range strings.Split(e[3], ",") {
				if !ours[m] {
					keep = append(keep, m)
				}
			}
			e[3] = strings.Join(keep, ",")
			f.set(i, e)
		}
	}
	return added, nil
}

// checkConflicts refuses a name that exists with another id, and an id that
// belongs to another name.
func (t *Table) checkConflicts(d *dbs) error {
	check := func(f *dbFile, kind, name string, id int) error {
		if i := f.find(name); i >= 0 {
			e := f.get(i)
			if len(e) < 3 || e[2] != strconv.Itoa(id) {
				have := "?"
				if len(e) >= 3 {
					have = e[2]
				}
				return fmt.Errorf("roles: %s: %s %q has id %s, but the role table gives it %d", f.path, kind, name, have, id)
			}
		}
		if i := f.findID(id); i >= 0 {
			if e := f.get(i); e[0] != name {
				return fmt.Errorf("roles: %s: id %d belongs to %s %q, but the role table gives it to %q", f.path, id, kind, e[0], name)
			}
		}
		return nil
	}
	for _, r := range t.Roles {
		if err := check(d.passwd, "user", r.User, r.UID); err != nil {
			return err
		}
		if err := check(d.group, "group", r.User, r.GID); err != nil {
			return err
		}
	}
	for _, g := range t.Groups {
		if err := check(d.group, "group", g.Unix, g.GID); err != nil {
			return err
		}
	}
	return nil
}

// Remove deletes the table's users and groups from etc's files. It only
// removes an entry whose name and id both match the table.
func (t *Table) Remove(etc string) (removed []string, err error) {
	return changeDBs(etc, t.removeFrom)
}

// removeFrom is Remove on the databases read: what it removed.
func (t *Table) removeFrom(d *dbs) (removed []string, err error) {
	drop := func(f *dbFile, name string, id int, checkID bool) bool {
		if f == nil {
			return false
		}
		i := f.find(name)
		if i < 0 {
			return false
		}
		if checkID {
			if e := f.get(i); len(e) < 3 || e[2] != strconv.Itoa(id) {
				return false
			}
		}
		f.remove(i)
		return true
	}
	for _, r := range t.Roles {
		if drop(d.passwd, r.User, r.UID, true) {
			removed = append(removed, "user "+r.User)
			drop(d.shadow, r.User, 0, false)
		}
		if drop(d.group, r.User, r.GID, true) {
			drop(d.gshadow, r.User, 0, false)
		}
	}
	for _, g := range t.Groups {
		if drop(d.group, g.Unix, g.GID, true) {
			removed = append(removed, "group "+g.Unix)
			drop(d.gshadow, g.Unix, 0, false)
		}
	}
	return removed, nil
}

// GroupsInEtc reads etc/group and says which groups name user as a member,
// as gids. The self-test compares it with the table.
func GroupsInEtc(etc, user string) ([]int, error) {
	f, err := readDB(filepath.Join(etc, "group"), 4, false)
	if err != nil {
		return nil, err
	}
	var out []int
	for i := range f.lines {
		e := f.get(i)
		if len(e) < 4 || e[3] == "" {
			continue
		}
		for _, m := range strings.Split(e[3], ",") {
			if m == user {
				gid, err := strconv.Atoi(e[2])
				if err == nil {
					out = append(out, gid)
				}
			}
		}
	}
	return out, nil
}

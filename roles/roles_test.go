package roles

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"thermite/internal/config"
)

func TestDefaultTable(t *testing.T) {
	tab, err := FromConfig(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"thermite": 20000, "builder": 20001, "run": 20002, "planner": 20003, "model-check": 20004, "lane-1": 20101, "lane-16": 20116, "agent-1": 20201, "agent-16": 20216, "supervisor": 20300}
	for name, uid := range want {
		r, ok := tab.Role(name)
		if !ok || r.UID != uid || r.GID != uid || len(r.Groups) != 0 {
			t.Errorf("%s: %+v, want uid=gid=%d and no groups", name, r, uid)
		}
	}
	if len(tab.Roles) != 5+16+16+1 {
		t.Errorf("%d roles", len(tab.Roles))
	}
	seen := map[int]bool{}
	for _, r := range tab.Roles {
		if seen[r.UID] {
			t.Errorf("uid %d used twice", r.UID)
		}
		seen[r.UID] = true
	}
}

func TestTimingUsersAndGPUGroups(t *testing.T) {
	c := config.Default()
	c.TimingUsers = 3
	c.GPU.Layout = "dedicated"
	tab, err := FromConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	for name, uid := range map[string]int{"run": 20002, "run-2": 20010, "run-3": 20011} {
		r, ok := tab.Role(name)
		if !ok || r.UID != uid || r.Kind != Timing {
			t.Errorf("%s: %+v", name, r)
		}
	}
	run3, _ := tab.Role("run-3")
	if len(run3.Groups) != 2 || run3.Groups[0] != 20400 || run3.Groups[1] != 20401+2 {
		t.Errorf("run-3 groups %v, want gpu (20400) and gpu-2 (20403)", run3.Groups)
	}
	lane, _ := tab.Lane(1)
	if len(lane.Groups) != 0 {
		t.Errorf("a lane holds no GPU group outside a development run: %v", lane.Groups)
	}
}

func etcDir(t *testing.T) string {
	d := t.TempDir()
	files := map[string]string{
		"passwd":  "root:x:0:0:root:/root:/bin/bash\nbob:x:20050:20050::/home/bob:/bin/sh\n",
		"group":   "root:x:0:\nbob:x:20050:\nstaff:x:50:bob\n",
		"shadow":  "root:*:19000:0:99999:7:::\n",
		"gshadow": "root:*::\n",
	}
	for n, s := range files {
		mode := os.FileMode(0o644)
		if strings.Contains(n, "shadow") {
			mode = 0o640
		}
		if err := os.WriteFile(filepath.Join(d, n), []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func read(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEnsureIsIdempotentAndLocksPasswords(t *testing.T) {
	etc := etcDir(t)
	tab, _ := New(Spec{Prefix: "x-", Base: 30000, Lanes: 2, TimingUsers: 1})
	added, err := tab.Ensure(etc)
	if err != nil {
		t.Fatal(err)
	}
	if len(added) != 2*len(tab.Roles) {
		t.Fatalf("added %d entries, want %d", len(added), 2*len(tab.Roles))
	}
	passwd := read(t, filepath.Join(etc, "passwd"))
	if !strings.Contains(passwd, "x-lane-1:x:30101:30101:thermite lane-1:/nonexistent:/usr/sbin/nologin\n") {
		t.Fatalf("passwd:\n%s", passwd)
	}
	if !strings.Contains(read(t, filepath.Join(etc, "shadow")), "\nx-lane-1:!:") {
		t.Fatal("shadow lacks a locked entry for x-lane-1")
	}
	if !strings.Contains(read(t, filepath.Join(etc, "gshadow")), "x-lane-1:!::") {
		t.Fatal("gshadow lacks x-lane-1")
	}
	st, _ := os.Stat(filepath.Join(etc, "shadow"))
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("shadow mode changed to %v", st.Mode())
	}
	before := map[string]string{}
	for _, n := range []string{"passwd", "group", "shadow", "gshadow"} {
		before[n] = read(t, filepath.Join(etc, n))
	}
	added, err = tab.Ensure(etc)
	if err != nil || len(added) != 0 {
		t.Fatalf("second ensure: %v %v", added, err)
	}
	for n, s := range before {
		if read(t, filepath.Join(etc, n)) != s {
			t.Errorf("second ensure changed %s", n)
		}
	}
	removed, err := tab.Remove(etc)
	if err != nil || len(removed) != len(tab.Roles) {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if strings.Contains(read(t, filepath.Join(etc, "passwd")), "x-") || !strings.Contains(read(t, filepath.Join(etc, "passwd")), "bob") {
		t.Fatal("remove left a role or removed someone else")
	}
}

func TestEnsureRefusesConflictsNamingBoth(t *testing.T) {
	etc := etcDir(t)
	// bob owns uid 20050; a table whose lane-1 would be 20050 must refuse.
	tab, _ := New(Spec{Prefix: "", Base: 19949, Lanes: 2, TimingUsers: 1})
	before := read(t, filepath.Join(etc, "passwd"))
	_, err := tab.Ensure(etc)
	if err == nil || !strings.Contains(err.Error(), `"bob"`) || !strings.Contains(err.Error(), `"lane-1"`) || !strings.Contains(err.Error(), "20050") {
		t.Fatalf("error %v does not name both", err)
	}
	if read(t, filepath.Join(etc, "passwd")) != before {
		t.Fatal("a refused ensure wrote passwd")
	}
	// A role name that exists with another uid.
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0::/root:/bin/sh\ny-builder:x:777:777::/:/bin/sh\n"), 0o644)
	tab2, _ := New(Spec{Prefix: "y-", Base: 31000, Lanes: 1, TimingUsers: 1})
	_, err = tab2.Ensure(etc)
	if err == nil || !strings.Contains(err.Error(), `"y-builder" has id 777`) || !strings.Contains(err.Error(), "31001") {
		t.Fatalf("error %v", err)
	}
}

func TestEnsureTakesRolesOutOfForeignGroups(t *testing.T) {
	etc := etcDir(t)
	tab, _ := New(Spec{Prefix: "z-", Base: 32000, Lanes: 1, TimingUsers: 1})
	if _, err := tab.Ensure(etc); err != nil {
		t.Fatal(err)
	}
	g := read(t, filepath.Join(etc, "group"))
	g = strings.Replace(g, "staff:x:50:bob", "staff:x:50:bob,z-lane-1", 1)
	os.WriteFile(filepath.Join(etc, "group"), []byte(g), 0o644)
	if gids, _ := GroupsInEtc(etc, "z-lane-1"); len(gids) != 1 || gids[0] != 50 {
		t.Fatalf("GroupsInEtc: %v", gids)
	}
	if _, err := tab.Ensure(etc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(read(t, filepath.Join(etc, "group")), "staff:x:50:bob\n") {
		t.Fatal("ensure left z-lane-1 in staff")
	}
}

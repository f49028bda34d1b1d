package spawn

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"thermite/internal/seccomp"
	"thermite/internal/testrig"
)

// probeEnv runs this test binary as a probe instead of its tests: the
// child started by Start reports what it sees, as the role would.
const probeEnv = "THERMITE_SPAWN_PROBE"

// probeBin is a copy of this test binary that any user may execute (the
// go tool's build folder is root's alone).
var probeBin string

func TestMain(m *testing.M) {
	if what := os.Getenv(probeEnv); what != "" {
		os.Exit(probe(what, os.Args[1:]))
	}
	code := m.Run()
	if probeBin != "" {
		os.RemoveAll(filepath.Dir(probeBin))
	}
	os.Exit(code)
}

// probe is the child's side: each answer is one line on stdout.
func probe(what string, args []string) int {
	switch what {
	case "status":
		// What the kernel says of this process, and what it was given.
		data, _ := os.ReadFile("/proc/self/status")
		fmt.Print(string(data))
		limits, _ := os.ReadFile("/proc/self/limits")
		fmt.Print(string(limits))
		cwd, _ := os.Readlink("/proc/self/cwd")
		fmt.Printf("Cwd:\t%s\n", cwd)
		fmt.Printf("Umask:\t%04o\n", unix.Umask(0))
	case "fds":
		// Every descriptor open, then the ones asked about.
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			link, _ := os.Readlink("/proc/self/fd/" + e.Name())
			fmt.Printf("open %s %s\n", e.Name(), link)
		}
		for _, a := range args {
			fd, _ := strconv.Atoi(a)
			_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			if err != nil {
				fmt.Printf("fd %d: %v\n", fd, errnoName(err))
				continue
			}
			var st unix.Stat_t
			unix.Fstat(fd, &st)
			link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
			fmt.Printf("fd %d: open ino %d %s\n", fd, st.Ino, link)
		}
	case "open":
		for _, a := range args {
			f, err := os.Open(a)
			if err != nil {
				fmt.Printf("open %s: %s\n", a, errnoName(err))
				continue
			}
			f.Close()
			fmt.Printf("open %s: ok\n", a)
		}
	case "socket":
		for _, fam := range []int{unix.AF_UNIX, unix.AF_INET} {
			fd, err := unix.Socket(fam, unix.SOCK_STREAM, 0)
			if err != nil {
				fmt.Printf("socket %d: %s\n", fam, errnoName(err))
				continue
			}
			unix.Close(fd)
			fmt.Printf("socket %d: ok\n", fam)
		}
	case "netns":
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
			fmt.Printf("netns: %v\n", err)
			return 1
		}
		fmt.Printf("netns ino %d\n", st.Ino)
	case "cgroup":
		data, _ := os.ReadFile("/proc/self/cgroup")
		fmt.Print(string(data))
	}
	return 0
}

func errnoName(err error) string {
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

// rig is one test's ids and the probe binary.
type rig struct {
	t        *testing.T
	uid, gid int
	null     *os.File
}

func newRig(t *testing.T) *rig {
	testrig.RequireRoot(t)
	base := testrig.FreeUIDs(t)
	if probeBin == "" {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		dir, err := os.MkdirTemp("", "spawn-probe-")
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o755)
		data, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "probe")
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		probeBin = p
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { null.Close() })
	return &rig{t: t, uid: base + 7, gid: base + 8, null: null}
}

// command is a probe as the rig's user, with nothing else set.
func (r *rig) command(what string, args ...string) *Command {
	return &Command{
		Argv: append([]string{probeBin}, args...),
		Env:  []string{probeEnv + "=" + what, "PATH=/usr/bin:/bin"},
		UID:  r.uid, GID: r.gid,
		Stdin: r.null, Stdout: r.null, Stderr: r.null,
	}
}

// run starts c with its stdout on a pipe and returns what it printed.
func (r *rig) run(c *Command) string {
	r.t.Helper()
	out, err := r.start(c)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

func (r *rig) start(c *Command) (string, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer pr.Close()
	c.Stdout = pw
	ch, err := Start(c)
	pw.Close()
	if ch == nil {
		return "", err
	}
	data, _ := io.ReadAll(pr)
	ws, _, werr := ch.Wait()
	if err != nil {
		if !ws.Exited() || ws.ExitStatus() != 127 {
			r.t.Errorf("a child that failed its start ended with %v, want exit 127", ws)
		}
		return string(data), err
	}
	if werr != nil || !ws.Exited() || ws.ExitStatus() != 0 {
		return string(data), fmt.Errorf("probe: %v %v: %s", werr, ws, data)
	}
	return string(data), nil
}

// field is a /proc/self/status line's value (or a /proc/self/limits
// line's, which has no colon).
func field(status, name string) string {
	for _, l := range strings.Split(status, "\n") {
		v, ok := strings.CutPrefix(l, name+":")
		if !ok && strings.HasPrefix(l, "Max ") {
			v, ok = strings.CutPrefix(l, name+"  ")
		}
		if ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "(no " + name + ")"
}

// TestChildRunsAsTheRoleUserOnly: a started command has the role's uid and
// gid in every slot and exactly its groups, no capability to pass on
// (inheritable and ambient empty), no_new_privs set, and not root's umask.
func TestChildRunsAsTheRoleUserOnly(t *testing.T) {
	r := newRig(t)
	c := r.command("status")
	c.Groups = []int{r.gid + 1, r.gid + 2}
	st := r.run(c)
	u, g := strconv.Itoa(r.uid), strconv.Itoa(r.gid)
	for name, want := range map[string]string{
		"Uid":        strings.Join([]string{u, u, u, u}, " "),
		"Gid":        strings.Join([]string{g, g, g, g}, " "),
		"Groups":     fmt.Sprintf("%d %d", r.gid+1, r.gid+2),
		"NoNewPrivs": "1",
		"CapInh":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapEff":     "0000000000000000",
		"CapAmb":     "0000000000000000",
		"Umask":      "0022",
	} {
		if got := field(st, name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}

// TestChildCannotStayInTheBrokersSession: the command leads a session of
// its own, so a signal to the broker's process group never reaches it and
// the broker's to the command's group reaches nothing else.
func TestChildCannotStayInTheBrokersSession(t *testing.T) {
	r := newRig(t)
	c := r.command("status")
	st := r.run(c)
	pid := field(st, "Pid")
	stat, _ := os.ReadFile("/proc/self/stat")
	_ = stat
	// NSsid is the session id as the child's namespace sees it.
	if got := field(st, "NSsid"); got != pid {
		t.Errorf("session %s, want its own (%s)", got, pid)
	}
}

// TestChildPinnedToItsCPUsWithItsLimits: the affinity, every rlimit and
// the working folder are what the command was given.
func TestChildPinnedToItsCPUsWithItsLimits(t *testing.T) {
	r := newRig(t)
	dir, err := os.MkdirTemp("", "spawn-cwd-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := r.command("status")
	c.Dir = d
	c.CPUs = []int{0}
	c.Rlimits = []Rlimit{
		{Resource: unix.RLIMIT_NPROC, Cur: 300, Max: 300}, // moved last
		{Resource: unix.RLIMIT_NOFILE, Cur: 64, Max: 64},
		{Resource: unix.RLIMIT_CORE, Cur: 0, Max: 0},
		{Resource: unix.RLIMIT_CPU, Cur: 7, Max: 8},
	}
	st := r.run(c)
	if got := field(st, "Cpus_allowed_list"); got != "0" {
		t.Errorf("Cpus_allowed_list %q, want 0", got)
	}
	for name, want := range map[string]string{
		"Max processes":      "300 300 processes",
		"Max open files":     "64 64 files",
		"Max core file size": "0 0 bytes",
		"Max cpu time":       "7 8 seconds",
	} {
		if got := field(st, name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if got := field(st, "Cwd"); got != dir {
		t.Errorf("cwd %q, want %q", got, dir)
	}
}

// TestBrokerDescriptorsAreNotInherited: of everything the starting process
// holds, the command gets its stdio and its inherited slots only, even a
// descriptor opened without close-on-exec; an inherited slot is the file
// it was given, whatever number it had.
func TestBrokerDescriptorsAreNotInherited(t *testing.T) {
	r := newRig(t)
	// A leak the way a careless library would make one, at a low number
	// and at a high one.
	leaked := filepath.Join(filepath.Dir(probeBin), "leaked")
	if err := os.WriteFile(leaked, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	leak, err := unix.Open(leaked, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(leak)
	if err := unix.Dup3(leak, 300, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(300)
	given, err := os.Open("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close()
	c := r.command("fds", strconv.Itoa(leak), "300", strconv.Itoa(slotFD+1))
	c.Slots = []Slot{{Name: "given", FD: slotFD, File: given}}
	out := r.run(c)
	if strings.Contains(out, leaked) {
		t.Errorf("a descriptor the broker opened without close-on-exec reached the command:\n%s", out)
	}
	for _, want := range []string{
		fmt.Sprintf("open %d /etc/passwd", slotFD),
		"fd 300: EBADF",
		fmt.Sprintf("fd %d: EBADF", slotFD+1),
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
	if leak != slotFD && !strings.Contains(out, fmt.Sprintf("fd %d: EBADF\n", leak)) && !strings.Contains(out, fmt.Sprintf("fd %d: open", leak)) {
		t.Errorf("no answer for fd %d:\n%s", leak, out)
	}
}

// slotFD is the number the descriptor tests hand a slot at: the
// controller's first, as it would be in a broker.
const slotFD = 7

// TestInheritedSlotsSurviveCollisions: sources that sit on each other's
// slot numbers land where they belong: stdin's file is what collideFD
// must not get, and the other way round.
func TestInheritedSlotsSurviveCollisions(t *testing.T) {
	r := newRig(t)
	// Numbers well above what a test process holds, so that the test
	// runs rather than skips: slots may be any number above stderr.
	const collideFD = 40
	// /etc/passwd sits at collideFD and goes to stdin and collideFD+1;
	// /etc/group sits at collideFD+1 and goes to collideFD. Both are
	// opened high first, so that neither lands on the other's number.
	for i, name := range []string{"/etc/passwd", "/etc/group"} {
		fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Skipf("needs %s: %v", name, err)
		}
		high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 400)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.FcntlInt(uintptr(collideFD+i), unix.F_GETFD, 0); err == nil {
			unix.Close(high)
			t.Skipf("descriptor %d is this test process's own", collideFD+i)
		}
		if err := unix.Dup3(high, collideFD+i, unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(high)
	}
	atSlot := os.NewFile(collideFD, "passwd-at-slot")
	defer atSlot.Close()
	atNext := os.NewFile(collideFD+1, "group-at-next")
	defer atNext.Close()
	c := r.command("fds")
	c.Stdin = atSlot
	c.Slots = []Slot{{Name: "group", FD: collideFD, File: atNext}, {Name: "passwd", FD: collideFD + 1, File: atSlot}}
	out := r.run(c)
	for _, want := range []string{
		"open 0 /etc/passwd",
		fmt.Sprintf("open %d /etc/group", collideFD),
		fmt.Sprintf("open %d /etc/passwd", collideFD+1),
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
}

// ruleset is a Landlock rule set allowing reads and execution beneath
// dirs only.
func ruleset(t *testing.T, dirs ...string) *os.File {
	if _, err := llsys.LandlockGetABIVersion(); err != nil {
		t.Skipf("needs Landlock: %v", err)
	}
	access := uint64(llsys.AccessFSExecute | llsys.AccessFSReadFile | llsys.AccessFSReadDir)
	fd, err := llsys.LandlockCreateRuleset(&llsys.RulesetAttr{HandledAccessFS: access}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		pfd, err := unix.Open(d, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		err = llsys.LandlockAddPathBeneathRule(fd, &llsys.PathBeneathAttr{AllowedAccess: access, ParentFd: pfd}, 0)
		unix.Close(pfd)
		if err != nil {
			t.Fatal(err)
		}
	}
	f := os.NewFile(uintptr(fd), "ruleset")
	t.Cleanup(func() { f.Close() })
	return f
}

// TestLandlockRefusesOutsideTheRuleSet: a command under a rule set gets
// EACCES on a file outside it that its user could otherwise read, and
// reads one inside.
func TestLandlockRefusesOutsideTheRuleSet(t *testing.T) {
	r := newRig(t)
	outside, err := os.MkdirTemp("", "spawn-outside-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(outside)
	os.Chmod(outside, 0o755)
	secret := filepath.Join(outside, "f")
	os.WriteFile(secret, []byte("x"), 0o644)
	inside := filepath.Join(filepath.Dir(probeBin), "readable")
	os.WriteFile(inside, []byte("x"), 0o644)
	c := r.command("open", secret, inside)
	c.Landlock = ruleset(t, filepath.Dir(probeBin), "/etc", "/proc", "/usr", "/lib", "/lib64")
	out := r.run(c)
	for _, want := range []string{"open " + secret + ": EACCES", "open " + inside + ": ok"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
	// The same without the rule set reads it: the refusal is Landlock's.
	if out := r.run(r.command("open", secret)); !strings.Contains(out, "open "+secret+": ok") {
		t.Errorf("without the rule set: %s", out)
	}
}

// TestSeccompRefusesAFilteredCall: under the network "none" filter a TCP
// socket is EPERM and a unix socket is made; without it both are.
func TestSeccompRefusesAFilteredCall(t *testing.T) {
	r := newRig(t)
	var cache seccomp.Cache
	f, err := cache.Get(seccomp.Options{Network: seccomp.NetworkNone})
	if err != nil {
		t.Skipf("needs this architecture's filter: %v", err)
	}
	c := r.command("socket")
	c.Seccomp = f
	out := r.run(c)
	for _, want := range []string{fmt.Sprintf("socket %d: ok", unix.AF_UNIX), fmt.Sprintf("socket %d: EPERM", unix.AF_INET)} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
	if out := r.run(r.command("socket")); !strings.Contains(out, fmt.Sprintf("socket %d: ok", unix.AF_INET)) {
		t.Errorf("without the filter: %s", out)
	}
}

// TestChildJoinsItsNetworkNamespace: given a network namespace, the
// command is in it, not in the starting process's.
func TestChildJoinsItsNetworkNamespace(t *testing.T) {
	r := newRig(t)
	ns := newNetNS(t)
	var want unix.Stat_t
	unix.Fstat(int(ns.Fd()), &want)
	c := r.command("netns")
	c.NetNS = ns
	if out := r.run(c); out != fmt.Sprintf("netns ino %d\n", want.Ino) {
		t.Errorf("child: %q, want the namespace's inode %d", out, want.Ino)
	}
	if out := r.run(r.command("netns")); out == fmt.Sprintf("netns ino %d\n", want.Ino) {
		t.Errorf("without NetNS the child is in the namespace too: %q", out)
	}
}

// newNetNS makes a network namespace, held by a descriptor: a process
// born in a new one, whose namespace is opened before it is ended.
func newNetNS(t *testing.T) *os.File {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Skipf("needs CLONE_NEWNET: %v", err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	cmd.Process.Kill()
	cmd.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestCgroupV1PlacesTheChildBeforeExec: given a v1 hierarchy's
// cgroup.procs, the command is in that group from its first instruction.
func TestCgroupV1PlacesTheChildBeforeExec(t *testing.T) {
	r := newRig(t)
	dir := filepath.Join("/sys/fs/cgroup/pids", fmt.Sprintf("thermite-spawn-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("needs a writable cgroup v1 pids hierarchy: %v", err)
	}
	defer os.Remove(dir)
	procs, err := os.OpenFile(filepath.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer procs.Close()
	c := r.command("cgroup")
	c.CgroupProcs = []*os.File{procs}
	out := r.run(c)
	if !strings.Contains(out, ":pids:/"+filepath.Base(dir)+"\n") {
		t.Errorf("the child's cgroups:\n%s\nwant pids:/%s", out, filepath.Base(dir))
	}
}

// TestCgroupV2BornInItsGroup: given a cgroup v2 directory, the child is
// born in the group (clone3 CLONE_INTO_CGROUP): it never ran outside it.
func TestCgroupV2BornInItsGroup(t *testing.T) {
	r := newRig(t)
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil || fs.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Skip("needs cgroup v2 at /sys/fs/cgroup (e2e/vm boots a kernel with it: THERMITE_VM=1 THERMITE_VM_MODES=true THERMITE_VM_PACKAGES=./internal/spawn e2e/vm/run.sh)")
	}
	name := fmt.Sprintf("thermite-spawn-test-%d", os.Getpid())
	dir := filepath.Join("/sys/fs/cgroup", name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("needs a writable cgroup v2 tree: %v", err)
	}
	defer os.Remove(dir)
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := r.command("cgroup")
	c.UseCgroupDir, c.CgroupDir = true, int(d.Fd())
	out := r.run(c)
	if out != "0::/"+name+"\n" {
		t.Errorf("the child's cgroup: %q, want 0::/%s", out, name)
	}
}

// TestFailedStageIsReportedByName: a stage the kernel refuses comes back
// as that stage and its errno, and the child ends with 127 having run
// nothing.
func TestFailedStageIsReportedByName(t *testing.T) {
	r := newRig(t)
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	c := r.command("status")
	// Raising a hard limit needs CAP_SYS_RESOURCE, which the user lacks.
	c.Rlimits = []Rlimit{{Resource: unix.RLIMIT_NOFILE, Cur: lim.Max, Max: lim.Max + 1}}
	out, err := r.start(c)
	var se *StageError
	if !errors.As(err, &se) || se.Stage != StageRlimit || se.Errno != unix.EPERM {
		t.Fatalf("got %v, want a prlimit64 EPERM", err)
	}
	if want := "spawn: prlimit64 RLIMIT_NOFILE: EPERM"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if out != "" {
		t.Errorf("the command ran: %q", out)
	}

	// A rule set descriptor that is not one.
	c = r.command("status")
	c.Landlock = r.null
	if _, err := r.start(c); !errors.As(err, &se) || se.Stage != StageLandlock {
		t.Errorf("got %v, want a landlock_restrict_self failure", err)
	} else if !strings.HasPrefix(err.Error(), "spawn: landlock_restrict_self: ") {
		t.Errorf("error %q", err)
	}

	// A program that is nowhere in PATH.
	c = r.command("status")
	c.Argv = []string{"no-such-program-here"}
	if _, err := r.start(c); err == nil || err.Error() != "spawn: execve no-such-program-here: not found (ENOENT)" {
		t.Errorf("got %v", err)
	}
}

// TestCwdTheUserCannotEnterIsRefused: the working folder is entered as
// the user, after the credentials: a folder only root may enter is
// refused, not entered with the starting process's rights.
func TestCwdTheUserCannotEnterIsRefused(t *testing.T) {
	r := newRig(t)
	dir, err := os.MkdirTemp("", "spawn-closed-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o700)
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := r.command("status")
	c.Dir = d
	if _, err := r.start(c); err == nil || err.Error() != "spawn: fchdir: EACCES" {
		t.Errorf("got %v, want spawn: fchdir: EACCES", err)
	}
}

// TestCommandFoundInItsOwnPath: a bare name runs from the command's PATH,
// passing over a folder where the name is not executable.
func TestCommandFoundInItsOwnPath(t *testing.T) {
	r := newRig(t)
	bad, err := os.MkdirTemp("", "spawn-path-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(bad)
	os.Chmod(bad, 0o755)
	os.WriteFile(filepath.Join(bad, "probe"), []byte("not a program"), 0o644)
	c := r.command("netns")
	c.Argv = []string{"probe"}
	c.Env = []string{probeEnv + "=netns", "PATH=" + bad + ":relative:" + filepath.Dir(probeBin)}
	if out := r.run(c); !strings.HasPrefix(out, "netns ino ") {
		t.Errorf("got %q", out)
	}
}

// TestRootIsRefused: Start never runs a command as root.
func TestRootIsRefused(t *testing.T) {
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	_, err := Start(&Command{Argv: []string{"/bin/true"}, Stdin: null, Stdout: null, Stderr: null})
	if err == nil || !strings.Contains(err.Error(), "never runs as root") {
		t.Errorf("got %v", err)
	}
}

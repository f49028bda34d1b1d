// Package testrig sets up a throwaway rig for tests, driving the built
// binary the way an operator does: its own state dir, role prefix and uid
// base, stand-in folders for the closed temporary places, and clean-up of
// users, processes and folders afterwards. It needs root.
package testrig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"thermite/internal/config"
	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/internal/sysvipc"
	"thermite/roles"
)

// RequireRoot skips a test that needs root, saying so.
func RequireRoot(t testing.TB) {
	t.Helper()
	requireRoot(t, "it creates role users and runs commands as them (CI runs tests as root)")
}

// RequireRootForNodes skips a test that makes stand-in device nodes
// (StandInGPUs, MakeNode, or its own): mknod needs root.
func RequireRootForNodes(t testing.TB) {
	t.Helper()
	requireRoot(t, "it makes stand-in device nodes with mknod")
}

func requireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short): " + why)
	}
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// ModuleRoot is the repository's root folder.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Binary builds thermite once per test process (per set of build tags)
// into a folder every role can reach, and returns its path.
func Binary(t testing.TB, tags string) string {
	t.Helper()
	return build(t, "thermite", tags)
}

// RunAsBinary builds thermite-run-as, the light run-as client, once per
// test process, and returns its path.
func RunAsBinary(t testing.TB) string {
	t.Helper()
	return build(t, "thermite-run-as", "")
}

// build builds ./cmd/NAME with tags, once per test process.
func build(t testing.TB, name, tags string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[name+" "+tags]; ok {
		return p
	}
	if len(built) == 0 {
		removeStaleBinaries()
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("thermite-bin-%d-", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "./cmd/"+name)
	cmd := exec.Command("go", args...)
	cmd.Dir = ModuleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	built[name+" "+tags] = out
	return out
}

// removeStaleBinaries removes the binaries earlier test processes built
// (thermite-bin-<pid>-*), once those processes are gone.
func removeStaleBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "thermite-bin-*"))
	for _, d := range dirs {
		parts := strings.Split(filepath.Base(d), "-")
		if len(parts) < 4 {
			os.RemoveAll(d) // an older name, without a pid
			continue
		}
		pid, err := strconv.Atoi(parts[2])
		if err != nil || syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(d)
		}
	}
}

// Options shape a rig.
type Options struct {
	Lanes       int
	TimingUsers int
	Secrets     map[string]string // file name -> value, written 0600 root
	Extra       string            // more TOML, appended to the generated file
	Tags        string            // build tags for the binary ("thermite_weaken")
	Env         []string          // extra environment for the broker
	NoStart     bool              // write everything but do not start the broker
	// NoSecretsDir points secrets_dir at a folder that does not exist, as
	// on a fresh machine with no /etc/thermite.
	NoSecretsDir bool
	// GPUs makes a stand-in device tree with this many cards (mknod c 1 3,
	// which behaves like /dev/null) and points the rig's [gpu] at it.
	GPUs      int
	GPULayout string // "shared" or "dedicated" (default dedicated)
	GPUExtra  string // more keys for the [gpu] section
	APIExtra  string // more keys for the [api] section
	// ServeArgs are more arguments for `thermite serve`.
	ServeArgs []string
	// Alone keeps the test from running beside other tests (see
	// Parallel): it measures time, load or the machine's shared pools, or
	// changes what every rig on the machine sees.
	Alone bool
	// Wrap is a command that runs `thermite serve` (its argv, thermite's
	// after it), as a container that gives less would: `setpriv
	// --bounding-set=-checkpoint_restore --`.
	Wrap []string
}

// Rig is one throwaway rig.
type Rig struct {
	T       testing.TB
	Dir     string
	Bin     string
	Config  string
	Cfg     config.Config
	Table   *roles.Table
	Log     string
	opts    Options
	broker  *exec.Cmd
	exited  chan struct{}
	exitErr error
}

// New makes a rig: config, folders, secrets and role users. Unless
// NoStart, it starts the broker and waits until the controller answers.
// Everything is removed when the test ends.
func New(t testing.TB, o Options) *Rig {
	t.Helper()
	RequireRoot(t)
	if !o.Alone {
		Parallel(t)
	}
	if o.Lanes == 0 {
		o.Lanes = 2
	}
	if o.TimingUsers == 0 {
		o.TimingUsers = 1
	}
	r := &Rig{T: t, opts: o, Bin: Binary(t, o.Tags)}
	dir, err := os.MkdirTemp("", "thermite-rig-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	r.Dir = dir
	for _, d := range []string{"state", "closed-tmp", "closed-vartmp", "closed-shm", "secrets"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	os.Chmod(filepath.Join(dir, "closed-tmp"), 0o777|os.ModeSticky)
	os.Chmod(filepath.Join(dir, "secrets"), 0o700)
	for name, v := range o.Secrets {
		if err := os.WriteFile(filepath.Join(dir, "secrets", name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	secretsDir := filepath.Join(dir, "secrets")
	if o.NoSecretsDir {
		os.RemoveAll(secretsDir)
		secretsDir = filepath.Join(dir, "etc-thermite", "secrets")
	}
	prefix, base := freeIDs(t)
	gpu := ""
	if o.GPUs > 0 {
		if o.GPULayout == "" {
			o.GPULayout = "dedicated"
		}
		StandInGPUs(t, dir, o.GPUs)
		gpu = fmt.Sprintf("[gpu]\nlayout = %q\ndev_root = %q\nproc_root = %q\n%s\n", o.GPULayout, filepath.Join(dir, "dev"), filepath.Join(dir, "proc"), o.GPUExtra)
	}
	// A free loopback port, so that rigs in parallel do not collide.
	gpu += fmt.Sprintf("[api]\ntcp = \"127.0.0.1:0\"\n%s\n", o.APIExtra)
	cfgText := fmt.Sprintf(`state_dir = %q
secrets_dir = %q
role_prefix = %q
uid_base = %d
lanes = %d
timing_users = %d
closed_tmp = [%q, %q, %q]
%s
%s
`, filepath.Join(dir, "state"), secretsDir, prefix, base, o.Lanes, o.TimingUsers,
		filepath.Join(dir, "closed-tmp"), filepath.Join(dir, "closed-vartmp"), filepath.Join(dir, "closed-shm"), o.Extra, gpu)
	r.Config = filepath.Join(dir, "rig.toml")
	if err := os.WriteFile(r.Config, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	r.Cfg, err = config.Load(r.Config)
	if err != nil {
		t.Fatal(err)
	}
	r.Table, err = roles.FromConfig(r.Cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Log = filepath.Join(dir, "broker.log")
	t.Cleanup(r.cleanup)
	if _, stderr, code := r.Thermite("roles", "ensure"); code != 0 {
		t.Fatalf("roles ensure: %s", stderr)
	}
	if !o.NoStart {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// parallelized holds the top-level tests Parallel has let run beside
// others, so that a test that makes a second rig is not marked twice
// (t.Parallel panics then).
var parallelized sync.Map

// Parallel lets a top-level test run beside the package's other parallel
// tests (go test's -parallel bounds how many): each rig has its own role
// prefix, uid range, state folder, stand-in temporary places and cgroups,
// so rigs do not see each other. Every test that makes a rig is parallel
// unless its Options say Alone; THERMITE_TEST_ALONE=1 runs every test
// alone, to tell a test's own failure from one its neighbours caused.
// Subtests and benchmarks stay as they are.
func Parallel(t testing.TB) {
	tt, ok := t.(*testing.T)
	if !ok || strings.Contains(tt.Name(), "/") || os.Getenv("THERMITE_TEST_ALONE") == "1" {
		return
	}
	if _, done := parallelized.LoadOrStore(tt, true); !done {
		tt.Parallel()
	}
}

// startWithin is how long Start waits for a rig to be ready.
const startWithin = time.Minute

// reserveDir holds one marker per uid range a running test holds.
const reserveDir = "/run/thermite-testrig"

// FreeUIDs reserves a range of 500 user and group ids that nothing on the
// machine uses, for the length of the test, and returns its base: for
// tests that start processes under ids no user needs to exist for.
func FreeUIDs(t testing.TB) int {
	_, base := freeIDs(t)
	return base
}

// freeIDs picks a role prefix and a uid base that nothing on the machine
// uses: no user or group id in [base, base+500).
func freeIDs(t testing.TB) (string, int) {
	used := map[int]bool{}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		data, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(data), "\n") {
			e := strings.Split(l, ":")
			if len(e) >= 3 {
				if id, err := strconv.Atoi(e[2]); err == nil {
					used[id/1000] = true
				}
			}
		}
	}
	// Tests in other processes (other packages, other checkouts) pick at
	// the same time, before any of them has written its users: a marker
	// made with O_EXCL reserves the range until this test ends.
	os.MkdirAll(reserveDir, 0o700)
	for i := 0; i < 200; i++ {
		base := 40000 + 1000*rand.IntN(150)
		if used[base/1000] {
			continue
		}
		marker := filepath.Join(reserveDir, strconv.Itoa(base))
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			continue
		}
		f.Close()
		t.Cleanup(func() { os.Remove(marker) })
		letters := "abcdefghijklmnopqrstuvwxyz"
		p := "t"
		for j := 0; j < 3; j++ {
			p += string(letters[rand.IntN(len(letters))])
		}
		return p + "-", base
	}
	t.Fatal("no free uid range in 40000..189000")
	return "", 0
}

// Start starts the broker, `thermite serve`, and waits until the rig is
// ready: the controller answers. It skips the test where the broker
// refuses this kernel for its Landlock ABI.
func (r *Rig) Start() error {
	r.T.Helper()
	if err := r.Launch(); err != nil {
		return err
	}
	// A liveness bound, not a speed one: rigs of parallel tests start
	// side by side on a loaded machine.
	deadline := time.Now().Add(startWithin)
	for time.Now().Before(deadline) {
		select {
		case <-r.exited:
			log := r.LogText()
			// The broker refuses a kernel without the Landlock ABI its
			// policy needs: no test of a running rig can pass there.
			if i := strings.Index(log, landlockRefusal); i >= 0 {
				line, _, _ := strings.Cut(log[strings.LastIndex(log[:i], "\n")+1:], "\n")
				r.T.Skipf("this kernel lacks the Landlock ABI the broker needs, so no rig can start here: %s", line)
			}
			// The same for a machine with no writable cgroup tree, which the
			// kernel policy refuses unless the test accepts the loss.
			if i := strings.Index(log, cgroupRefusal); i >= 0 {
				line, _, _ := strings.Cut(log[strings.LastIndex(log[:i], "\n")+1:], "\n")
				r.T.Skipf("this machine has no writable cgroup tree, so no rig starts here without accept_lost: %s", line)
			}
			// And for one where serve cannot mount the broker's own /proc
			// (no CAP_SYS_ADMIN) on a host whose /proc shows every process.
			if i := strings.Index(log, procRefusal); i >= 0 {
				line, _, _ := strings.Cut(log[strings.LastIndex(log[:i], "\n")+1:], "\n")
				r.T.Skipf("roles here would see every process in /proc, so no rig starts here without accept_lost: %s", line)
			}
			return fmt.Errorf("broker exited at start: %v\n%s", r.exitErr, log)
		default:
		}
		// The broker's status reads every process's status file; its log
		// line is read first, so that a waiting test costs the machine
		// one status, not one every 30 ms (rigs start side by side).
		if strings.Contains(r.LogText(), `"msg":"rig ready"`) {
			resp, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStatus})
			if err == nil && resp.Status.Phase == rpc.PhaseReady {
				return nil
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
	return fmt.Errorf("broker did not come up in %s\n%s", startWithin, r.LogText())
}

// Launch starts `thermite serve` and returns at once.
func (r *Rig) Launch() error {
	r.T.Helper()
	logf, err := os.OpenFile(r.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	argv := append(append(append([]string{}, r.opts.Wrap...), r.Bin, "--config", r.Config, "serve"), r.opts.ServeArgs...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), r.opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	logf.Close()
	r.broker = cmd
	r.exited = make(chan struct{})
	go func() {
		r.exitErr = cmd.Wait()
		close(r.exited)
	}()
	return nil
}

// KillBroker ends the broker with SIGKILL, as a crash would: it cleans
// nothing up. The controller and role processes it started live on until
// the next start (or the test's clean-up) stops them.
func (r *Rig) KillBroker() {
	r.T.Helper()
	if r.broker == nil || r.broker.Process == nil {
		return
	}
	r.broker.Process.Kill()
	<-r.exited
}

// ClosedPlaces are the rig's stand-ins for /tmp, /var/tmp and /dev/shm.
func (r *Rig) ClosedPlaces() []string {
	return []string{filepath.Join(r.Dir, "closed-tmp"), filepath.Join(r.Dir, "closed-vartmp"), filepath.Join(r.Dir, "closed-shm")}
}

// PlaceModes is each closed place's owner and mode, "uid:gid 01777".
func (r *Rig) PlaceModes() []string {
	var out []string
	for _, p := range r.ClosedPlaces() {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			out = append(out, err.Error())
			continue
		}
		out = append(out, fmt.Sprintf("%d:%d %05o", st.Uid, st.Gid, st.Mode&0o7777))
	}
	return out
}

// procRefusal is part of the broker's error when /proc, as roles would see
// it, hides no process (hostpolicy's proc-hidepid).
const procRefusal = "proc-hidepid is lost"

// landlockRefusal is part of the broker's error when the kernel's Landlock
// ABI is older than its policy needs (broker/cgroups.go, decideKernelPolicy).
const landlockRefusal = "the policy every role command runs under needs Landlock ABI"

// cgroupRefusal is part of the broker's error when it finds no writable
// cgroup tree (internal/hostpolicy.Decide).
const cgroupRefusal = "cgroup-limits is lost"

// WaitExit waits for the broker to exit and returns its exit error.
func (r *Rig) WaitExit(d time.Duration) (error, bool) {
	select {
	case <-r.exited:
		return r.exitErr, true
	case <-time.After(d):
		return nil, false
	}
}

// LogText is the broker's log so far.
func (r *Rig) LogText() string {
	b, _ := os.ReadFile(r.Log)
	return string(b)
}

// Thermite runs the binary with the rig's config, as root.
func (r *Rig) Thermite(args ...string) (stdout, stderr string, code int) {
	return r.ThermiteIn(nil, args...)
}

// ThermiteIn is Thermite with stdin.
func (r *Rig) ThermiteIn(stdin []byte, args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(r.Bin, append([]string{"--config", r.Config}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	// A lane's leftover that kept the output pipe must not hang the test.
	cmd.WaitDelay = 20 * time.Second
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code = 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return o.String(), e.String(), code
}

// RunAs runs `thermite run-as ROLE [flags] -- argv` and fails the test if
// the command could not be asked for at all.
func (r *Rig) RunAs(role string, flags []string, argv ...string) (stdout, stderr string, code int) {
	args := append([]string{"run-as", role}, flags...)
	args = append(args, "--")
	args = append(args, argv...)
	return r.Thermite(args...)
}

// Probe runs one probe attempt as a role and returns what it got ("ok",
// "EACCES", ...).
func (r *Rig) Probe(role, op, target string, extra ...string) string {
	r.T.Helper()
	argv := append([]string{r.Bin, "__probe", "try", op, target}, extra...)
	out, stderr, code := r.RunAs(role, nil, argv...)
	if code != 0 {
		r.T.Fatalf("probe %s %s as %s: exit %d: %s", op, target, role, code, stderr)
	}
	return strings.TrimSpace(out)
}

// Status asks the broker for its status.
func (r *Rig) Status() *rpc.Status {
	r.T.Helper()
	resp, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStatus})
	if err != nil {
		r.T.Fatalf("status: %v", err)
	}
	return resp.Status
}

// Role is a role of the rig's table.
func (r *Rig) Role(name string) roles.Role {
	r.T.Helper()
	role, ok := r.Table.Role(name)
	if !ok {
		r.T.Fatalf("no role %s", name)
	}
	return role
}

// Procs is the pids a role's user runs now.
func (r *Rig) Procs(role string) []int {
	pids, _ := procs.ByUID("/proc", r.Role(role).UID)
	return pids
}

// StopBroker sends SIGTERM and waits for the broker to exit.
func (r *Rig) StopBroker() {
	if r.broker == nil || r.broker.Process == nil {
		return
	}
	select {
	case <-r.exited:
		return
	default:
	}
	r.broker.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(15 * time.Second):
		r.broker.Process.Kill()
		<-r.exited
	}
}

// JSON decodes s into v or fails the test.
func JSON(t testing.TB, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
}

func (r *Rig) cleanup() {
	r.StopBroker()
	if r.T.Failed() {
		r.T.Logf("broker log:\n%s", r.LogText())
	}
	// Whatever the broker left (it should leave nothing): end it by pid.
	for _, role := range r.Table.Roles {
		pids, _ := procs.ByUID("/proc", role.UID)
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	// SysV IPC objects the rig's roles made or own, which a broken build
	// under test may have left (root may remove any).
	uids := map[int]bool{}
	for _, role := range r.Table.Roles {
		uids[role.UID] = true
	}
	if objs, err := sysvipc.List("/proc"); err == nil {
		for _, o := range objs {
			if uids[o.UID] || uids[o.CUID] {
				sysvipc.Remove(o)
			}
		}
	}
	if _, stderr, code := r.Thermite("roles", "remove"); code != 0 {
		r.T.Errorf("roles remove: %s", stderr)
	}
	os.RemoveAll(r.Dir)
}

// EditEtc changes /etc/NAME under the lock shadow-utils and `roles ensure`
// take, so that no other test's edit is lost.
func EditEtc(t testing.TB, name string, edit func(string) string) {
	t.Helper()
	lf, err := os.OpenFile("/etc/.pwd.lock", os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK}
	if err := syscall.FcntlFlock(lf.Fd(), syscall.F_SETLKW, &lk); err != nil {
		t.Fatal(err)
	}
	defer func() {
		lk.Type = syscall.F_UNLCK
		syscall.FcntlFlock(lf.Fd(), syscall.F_SETLK, &lk)
	}()
	p := filepath.Join("/etc", name)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(edit(string(data))), 0o644); err != nil {
		t.Fatal(err)
	}
}

// StandInGPUs makes dir/dev with n stand-in cards (nvidia0…, character
// device 1:3, mode 0666 as on a host that leaves them open), the control
// nodes, a few ordinary nodes, and dir/proc/driver/nvidia/gpus/*/information
// naming each card's UUID and minor.
func StandInGPUs(t testing.TB, dir string, n int) {
	t.Helper()
	dev := filepath.Join(dir, "dev")
	os.MkdirAll(filepath.Join(dev, "nvidia-caps"), 0o755)
	os.MkdirAll(filepath.Join(dev, "pts"), 0o755)
	for _, name := range []string{"null", "zero", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps/nvidia-cap1"} {
		MakeNode(t, filepath.Join(dev, name))
	}
	for i := 0; i < n; i++ {
		AddCard(t, dir, i)
	}
}

// AddCard makes stand-in card i: dir/dev/nvidia<i> and its driver information.
func AddCard(t testing.TB, dir string, i int) {
	t.Helper()
	MakeNode(t, filepath.Join(dir, "dev", fmt.Sprintf("nvidia%d", i)))
	info := filepath.Join(dir, "proc", "driver", "nvidia", "gpus", fmt.Sprintf("0000:%02x:00.0", 0x10+i))
	os.MkdirAll(info, 0o755)
	text := fmt.Sprintf("Model: \t\t Stand-in H200\nGPU UUID: \t GPU-00000000-0000-0000-0000-%012d\nBus Location: \t 0000:%02x:00.0\nDevice Minor: \t %d\n", i, 0x10+i, i)
	if err := os.WriteFile(filepath.Join(info, "information"), []byte(text), 0o444); err != nil {
		t.Fatal(err)
	}
}

// CardUUID is stand-in card i's UUID.
func CardUUID(i int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i) }

// MakeNode makes a stand-in device node (1:3, like /dev/null), mode 0666.
func MakeNode(t testing.TB, p string) {
	t.Helper()
	if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatalf("mknod %s: %v", p, err)
	}
	os.Chmod(p, 0o666)
}

// FreezeDev bind-mounts the stand-in device tree read-only over itself, so
// nobody can change its nodes' owners or modes, as in a container that
// keeps them as they came. It is undone when the test ends.
func (r *Rig) FreezeDev() {
	r.T.Helper()
	dev := filepath.Join(r.Dir, "dev")
	if err := syscall.Mount(dev, dev, "", syscall.MS_BIND, ""); err != nil {
		r.T.Fatalf("bind %s: %v", dev, err)
	}
	r.T.Cleanup(func() { syscall.Unmount(dev, syscall.MNT_DETACH) })
	if err := syscall.Mount("", dev, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		r.T.Fatalf("remount %s read-only: %v", dev, err)
	}
}

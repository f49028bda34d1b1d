package selftest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/fence"
	"thermite/internal/cpuset"
)

// ProbeArg is the hidden subcommand a probe runs as. The probe is the
// thermite binary itself, run as a role by the broker's ordinary spawn path.
const ProbeArg = "__probe"

// Attempt is one thing a probe tries. The probe only reports what happened;
// whether that was right is decided by the self-test, outside the role.
type Attempt struct {
	ID   string `json:"id"`
	Op   string `json:"op"`
	Path string `json:"path,omitempty"`
	PID  int    `json:"pid,omitempty"`
	Arg  string `json:"arg,omitempty"`
}

// Outcome is what an attempt got: "ok", or the errno's name (EACCES), or
// "error: ..." for anything else. Detail carries what was seen.
type Outcome struct {
	ID     string `json:"id"`
	Got    string `json:"got"`
	Detail string `json:"detail,omitempty"`
}

// The probe's operations. Each does one system call's worth of trying.
const (
	OpFDs       = "fds"        // only 0, 1 and 2 are open
	OpStatus    = "status"     // Cap*, NoNewPrivs, ids and groups from /proc/self/status
	OpEnv       = "env"        // the environment, names only, and whether Arg's values appear in it
	OpRead      = "read"       // open Path read-only and read a byte
	OpList      = "list"       // open the folder Path and read its entries
	OpReadlink  = "readlink"   // read the target of the symlink Path (the target goes to Detail)
	OpCreateIn  = "create-in"  // create a new file in the folder Path, then remove it
	OpWrite     = "write"      // open the existing file Path for writing
	OpChmod     = "chmod"      // chmod Path to its mode with u+w
	OpRename    = "rename"     // rename Path to Path+".probe" (and back)
	OpConnect   = "connect"    // connect to the unix socket Path (stream, then seqpacket)
	OpSignal    = "signal"     // kill(PID, 0)
	OpPtrace    = "ptrace"     // PTRACE_ATTACH to PID (then detach)
	OpSetID     = "setid"      // create Path with mode 04755 and report its mode
	OpEtcGroups = "etc-groups" // the groups /etc/group names this user in
	OpOpenDev   = "open-dev"   // open the device file Path read-write
	OpIoctl3    = "ioctl3"     // open Path with access mode 3 (no read, no write) and ioctl it: "ok" when the ioctl reached the driver
	OpCards     = "cards"      // how many card nodes (nvidia[0-9]+) in the folder Path open read-write
	OpGetenv    = "getenv"     // the value of the variable Arg
	OpNVML      = "nvml"       // how many devices NVML reports
	OpAPI       = "api"        // GET /v1/trial on the harness API socket Path with the token Arg: the HTTP status
	OpUnshare   = "unshare"    // unshare(CLONE_NEWUSER)
	OpMount     = "mount"      // mount a tmpfs on the folder Path
	OpIOUring   = "io-uring"   // io_uring_setup
	OpAIO       = "aio"        // io_setup: a Linux AIO context
	OpTIOCSTI   = "tiocsti"    // ioctl(TIOCSTI) on a new pseudo-terminal
	OpChmodSUID = "chmod-suid" // create Path and chmod it 04755
	OpAbstract  = "abstract"   // connect to the abstract unix socket named Arg
	OpTCP       = "tcp"        // connect to Arg: a port on 127.0.0.1, or ADDRESS:PORT (IPv4 or [IPv6])
	OpCgroup    = "cgroup"     // this process's /proc/self/cgroup
	OpUDP       = "udp"        // make a UDP socket
	OpTraceMe   = "traceme"    // ptrace(PTRACE_TRACEME): make the parent, the broker, its tracer
	// OpAffinity asks sched_setaffinity for the CPU list Arg (or Path);
	// Detail is the CPUs the thread may run on afterwards.
	OpAffinity = "affinity"
	OpAddKey   = "add-key" // add_key a user key to the keyring Arg: process (""), session or user
	OpNetlink  = "netlink" // make a netlink socket of the family (protocol) Arg
)

// ProbeMain runs the probe. With `try OP PATH|PID` it runs one attempt and
// prints its outcome (for tests and operators); otherwise it reads a plan
// (JSON attempts) on stdin and writes outcomes (JSON) on stdout.
func ProbeMain(args []string) int {
	// Descriptors first, before the runtime or this code opens any.
	startFDs = openFDs()
	if len(args) >= 2 && args[0] == "try" {
		a := Attempt{ID: "try", Op: args[1]}
		if len(args) >= 3 {
			a.Path = args[2]
			if pid, err := strconv.Atoi(args[2]); err == nil {
				a.PID = pid
			}
		}
		if len(args) >= 4 {
			a.Arg = args[3]
		}
		o := runAttempt(a)
		fmt.Println(o.Got)
		if o.Detail != "" {
			fmt.Fprintln(os.Stderr, o.Detail)
		}
		return 0
	}
	if len(args) == 1 && args[0] == "canary" {
		// A canary process: it waits until its stdin closes.
		io.Copy(io.Discard, os.Stdin)
		return 0
	}
	var plan []Attempt
	if err := json.NewDecoder(io.LimitReader(os.Stdin, 1<<20)).Decode(&plan); err != nil {
		fmt.Fprintln(os.Stderr, "probe: plan:", err)
		return 2
	}
	out := make([]Outcome, 0, len(plan))
	for _, a := range plan {
		out = append(out, runAttempt(a))
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 2
	}
	return 0
}

// openFDs lists this process's open descriptors, without the one the
// listing itself uses. It reads /proc/self/fd through a raw descriptor so
// that nothing else is opened first.
func openFDs() []int {
	fd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return []int{-1}
	}
	defer unix.Close(fd)
	var out []int
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil || n <= 0 {
			break
		}
		b := buf[:n]
		for len(b) > 0 {
			reclen := int(b[16]) | int(b[17])<<8
			name := b[19:reclen]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			if v, err := strconv.Atoi(string(name)); err == nil && v != fd {
				out = append(out, v)
			}
			b = b[reclen:]
		}
	}
	sort.Ints(out)
	return out
}

func errName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if n := unix.ErrnoName(errno); n != "" {
			return n
		}
		return fmt.Sprintf("errno %d", int(errno))
	}
	return "error: " + err.Error()
}

func result(id string, err error) Outcome {
	if err == nil {
		return Outcome{ID: id, Got: "ok"}
	}
	return Outcome{ID: id, Got: errName(err), Detail: err.Error()}
}

// startFDs are the descriptors the probe found open when it started,
// before the runtime or this code opened any (ProbeMain fills it first).
var startFDs []int

// attempts maps each probe operation to the function that tries it. Each
// function is named for the attack it tries and only reports what
// happened: whether that was right is decided outside the role.
var attempts = map[string]func(Attempt) Outcome{
	OpFDs:       reportOpenFDs,
	OpStatus:    reportStatus,
	OpEnv:       reportEnvLeaks,
	OpRead:      readFile,
	OpList:      listFolder,
	OpReadlink:  readSymlink,
	OpCreateIn:  createFileIn,
	OpWrite:     openForWriting,
	OpChmod:     chmodWritable,
	OpRename:    renameAndBack,
	OpConnect:   connectUnixSocket,
	OpSignal:    signalProcess,
	OpPtrace:    ptraceAttach,
	OpSetID:     createSetIDFile,
	OpEtcGroups: reportEtcGroups,
	OpOpenDev:   openDeviceReadWrite,
	OpIoctl3:    ioctlWithoutAccess,
	OpCards:     openEveryCard,
	OpGetenv:    reportVariable,
	OpNVML:      reportNVMLDevices,
	OpAPI:       callHarnessAPI,
	OpUnshare:   unshareUserNamespace,
	OpMount:     mountTmpfs,
	OpIOUring:   setupIOUring,
	OpAIO:       setupAIO,
	OpTIOCSTI:   injectTerminalInput,
	OpChmodSUID: chmodSetUID,
	OpAbstract:  connectAbstractSocket,
	OpTCP:       connectTCPAttempt,
	OpCgroup:    reportCgroup,
	OpUDP:       makeUDPSocket,
	OpTraceMe:   traceMe,
	OpAffinity:  setAffinity,
	OpAddKey:    addKey,
	OpNetlink:   makeNetlinkSocket,
	// Issue 27's channels between roles (probe_channels.go).
	OpUnixSocket: makeUnixSocket,
	OpSocketPair: makeSocketPair,
	OpMkfifo:     makeFIFO,
	OpInotify:    watchWithInotify,
	OpFanotify:   watchWithFanotify,
	OpDnotify:    watchWithDnotify,
	OpOpenUp:     openFolderToAll,
	OpKeyctl:     keyctlAttempt,
	// Issue 12's SysV IPC and set-id attempts (probe_ipc.go).
	OpSysVShared:   makeSharedSysVObject,
	OpSysVOpenUp:   openUpSysVObject,
	OpSysVFind:     findSysVObject,
	OpSysVMake:     makeSysVObject,
	OpOpenat2Then:  createThroughOpenat2Fallback,
	OpPOSIXMQ:      openPOSIXQueue,
	OpOpenat2SetID: createSetIDThroughOpenat2,
	OpLinkSetID:    linkSetIDFile,
	OpFillHoles:    fillHolesThroughMmap,
	OpLongSymlinks: keepBytesInSymlinks,
	// The start window's attack (starts.go), and at its root
	// (probe_stop.go).
	OpStopOwn:   stopOwnProcesses,
	OpStopChild: stopOwnChild,
}

// runAttempt runs one attempt by its operation.
func runAttempt(a Attempt) Outcome {
	try, ok := attempts[a.Op]
	if !ok {
		return Outcome{ID: a.ID, Got: "error: unknown op " + a.Op}
	}
	return try(a)
}

// reportOpenFDs lists the descriptors open at start: a leaked one is a
// way into what its holder could reach.
func reportOpenFDs(a Attempt) Outcome {
	s := make([]string, len(startFDs))
	for i, f := range startFDs {
		s[i] = strconv.Itoa(f)
	}
	return Outcome{ID: a.ID, Got: "ok", Detail: strings.Join(s, ",")}
}

// reportStatus reports the ids, groups, capabilities, no_new_privs,
// seccomp mode and CPUs the kernel gave the process.
func reportStatus(a Attempt) Outcome {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return result(a.ID, err)
	}
	var keep []string
	for _, l := range strings.Split(string(data), "\n") {
		k, _, _ := strings.Cut(l, ":")
		switch k {
		case "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Cpus_allowed_list":
			keep = append(keep, l)
		}
	}
	return Outcome{ID: a.ID, Got: "ok", Detail: strings.Join(keep, "\n")}
}

// reportEnvLeaks lists the environment's names and says which variables
// hold one of the secrets in Arg (NUL-separated).
func reportEnvLeaks(a Attempt) Outcome {
	var names []string
	var leaked []string
	secrets := strings.Split(a.Arg, "\x00")
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		names = append(names, k)
		for _, s := range secrets {
			if s != "" && strings.Contains(v, s) {
				leaked = append(leaked, k)
			}
		}
	}
	sort.Strings(names)
	o := Outcome{ID: a.ID, Got: "ok", Detail: strings.Join(names, ",")}
	if len(leaked) > 0 {
		o.Got = "secret in " + strings.Join(leaked, ",")
	}
	return o
}

// readFile opens Path read-only and reads a byte.
func readFile(a Attempt) Outcome {
	f, err := os.Open(a.Path)
	if err != nil {
		return result(a.ID, err)
	}
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.Read(b)
	if err == io.EOF {
		err = nil
	}
	return result(a.ID, err)
}

// listFolder opens the folder Path and reads an entry.
func listFolder(a Attempt) Outcome {
	f, err := os.Open(a.Path)
	if err != nil {
		return result(a.ID, err)
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if err == io.EOF {
		err = nil
	}
	return result(a.ID, err)
}

// readSymlink reads the symlink Path's target.
func readSymlink(a Attempt) Outcome {
	target, err := os.Readlink(a.Path)
	o := result(a.ID, err)
	if err == nil {
		o.Detail = target
	}
	return o
}

// createFileIn creates a new file in the folder Path, then removes it.
func createFileIn(a Attempt) Outcome {
	p := fmt.Sprintf("%s/.thermite-probe-%d", a.Path, os.Getpid())
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return result(a.ID, err)
	}
	unix.Close(fd)
	unix.Unlink(p)
	return result(a.ID, nil)
}

// openForWriting opens the existing file Path for writing.
func openForWriting(a Attempt) Outcome {
	fd, err := unix.Open(a.Path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return result(a.ID, err)
}

// chmodWritable gives Path's owner write permission.
func chmodWritable(a Attempt) Outcome {
	var st unix.Stat_t
	if err := unix.Stat(a.Path, &st); err != nil {
		return result(a.ID, err)
	}
	return result(a.ID, unix.Chmod(a.Path, (st.Mode&0o7777)|0o200))
}

// renameAndBack renames Path aside and back.
func renameAndBack(a Attempt) Outcome {
	err := unix.Rename(a.Path, a.Path+".probe")
	if err == nil {
		unix.Rename(a.Path+".probe", a.Path)
	}
	return result(a.ID, err)
}

// connectUnixSocket connects to the unix socket Path, as seqpacket and
// then, for a socket of the other type, as a stream.
func connectUnixSocket(a Attempt) Outcome {
	var err error
	for _, netw := range []string{"unixpacket", "unix"} {
		var c net.Conn
		c, err = net.Dial(netw, a.Path)
		if err == nil {
			c.Close()
			return result(a.ID, nil)
		}
		if !errors.Is(err, unix.EPROTOTYPE) {
			break
		}
	}
	return result(a.ID, err)
}

// signalProcess sends signal 0 to PID.
func signalProcess(a Attempt) Outcome {
	return result(a.ID, unix.Kill(a.PID, 0))
}

// ptraceAttach attaches to PID as its tracer, then detaches.
func ptraceAttach(a Attempt) Outcome {
	err := unix.PtraceAttach(a.PID)
	if err == nil {
		unix.PtraceDetach(a.PID)
	}
	return result(a.ID, err)
}

// createSetIDFile creates Path, makes it set-user-id and set-group-id,
// and reports the mode the kernel left it.
func createSetIDFile(a Attempt) Outcome {
	fd, err := unix.Open(a.Path, unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0o755)
	if err != nil {
		return result(a.ID, err)
	}
	unix.Close(fd)
	if err := unix.Chmod(a.Path, 0o4755|unix.S_ISGID); err != nil {
		return result(a.ID, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(a.Path, &st); err != nil {
		return result(a.ID, err)
	}
	return Outcome{ID: a.ID, Got: "ok", Detail: fmt.Sprintf("%04o", st.Mode&0o7777)}
}

// reportEtcGroups lists the groups /etc/group names the user Arg in.
func reportEtcGroups(a Attempt) Outcome {
	data, err := os.ReadFile("/etc/group")
	if err != nil {
		return result(a.ID, err)
	}
	var gids []string
	for _, l := range strings.Split(string(data), "\n") {
		e := strings.Split(l, ":")
		if len(e) < 4 {
			continue
		}
		for _, m := range strings.Split(e[3], ",") {
			if m == a.Arg {
				gids = append(gids, e[2])
			}
		}
	}
	sort.Strings(gids)
	return Outcome{ID: a.ID, Got: "ok", Detail: strings.Join(gids, ",")}
}

// openDeviceReadWrite opens the device file Path read-write.
func openDeviceReadWrite(a Attempt) Outcome {
	fd, err := unix.Open(a.Path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err == nil {
		unix.Close(fd)
	}
	return result(a.ID, err)
}

// ioctlWithoutAccess opens Path with access mode 3 (neither read nor
// write, which still allows ioctl) and ioctls it: "ok" when the ioctl
// reached the driver.
func ioctlWithoutAccess(a Attempt) Outcome {
	fd, err := unix.Open(a.Path, 3|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return result(a.ID, err)
	}
	defer unix.Close(fd)
	_, err = unix.IoctlGetTermios(fd, unix.TCGETS)
	if err == unix.EACCES || err == unix.EPERM {
		return result(a.ID, err)
	}
	// Any other answer (ENOTTY from a stand-in node) came from the driver.
	return Outcome{ID: a.ID, Got: "ok", Detail: fmt.Sprintf("the driver answered: %v", err)}
}

// openEveryCard opens every card node (nvidia[0-9]+) in the folder Path
// read-write and reports how many opened.
func openEveryCard(a Attempt) Outcome {
	ents, err := os.ReadDir(a.Path)
	if err != nil {
		return result(a.ID, err)
	}
	var opened []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, "nvidia") || len(n) == 6 || strings.Trim(n[6:], "0123456789") != "" {
			continue
		}
		fd, err := unix.Open(a.Path+"/"+n, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err == nil {
			unix.Close(fd)
			opened = append(opened, n)
		}
	}
	return Outcome{ID: a.ID, Got: "ok", Detail: strconv.Itoa(len(opened)) + " " + strings.Join(opened, ",")}
}

// reportVariable reports the variable Arg's value, or "unset".
func reportVariable(a Attempt) Outcome {
	v, ok := os.LookupEnv(a.Arg)
	if !ok {
		return Outcome{ID: a.ID, Got: "unset"}
	}
	return Outcome{ID: a.ID, Got: "ok", Detail: v}
}

// reportNVMLDevices reports how many devices NVML sees.
func reportNVMLDevices(a Attempt) Outcome {
	n, note := fence.NVMLUsable()
	return Outcome{ID: a.ID, Got: "ok", Detail: strconv.Itoa(n) + " " + note}
}

// callHarnessAPI asks for GET /v1/trial on the API socket Path with the
// token Arg and reports the HTTP status.
func callHarnessAPI(a Attempt) Outcome {
	c, err := net.Dial("unix", a.Path)
	if err != nil {
		return result(a.ID, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /v1/trial HTTP/1.0\r\nHost: api\r\nAuthorization: Bearer %s\r\n\r\n", a.Arg)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return result(a.ID, err)
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return Outcome{ID: a.ID, Got: "error: bad answer " + strconv.Quote(line)}
	}
	return Outcome{ID: a.ID, Got: f[1]}
}

// unshareUserNamespace makes a new user namespace.
func unshareUserNamespace(a Attempt) Outcome {
	return result(a.ID, unix.Unshare(unix.CLONE_NEWUSER))
}

// mountTmpfs mounts a tmpfs on the folder Path.
func mountTmpfs(a Attempt) Outcome {
	return result(a.ID, unix.Mount("thermite-probe", a.Path, "tmpfs", 0, ""))
}

// traceMe makes the parent, the broker, this process's tracer.
func traceMe(a Attempt) Outcome {
	_, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0, 0, 0, 0)
	if errno != 0 {
		return result(a.ID, errno)
	}
	return result(a.ID, nil)
}

// setupIOUring sets up an io_uring, whose requests pass by seccomp.
func setupIOUring(a Attempt) Outcome {
	params := make([]byte, 120)
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return result(a.ID, errno)
	}
	unix.Close(int(fd))
	return result(a.ID, nil)
}

// setupAIO sets up a Linux AIO context, whose writes raise no inotify
// event.
func setupAIO(a Attempt) Outcome {
	var ctx uintptr
	_, _, errno := unix.Syscall(unix.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&ctx)), 0)
	if errno != 0 {
		return result(a.ID, errno)
	}
	unix.Syscall(unix.SYS_IO_DESTROY, ctx, 0, 0)
	return result(a.ID, nil)
}

// injectTerminalInput pushes a byte into a new pseudo-terminal's input
// with TIOCSTI.
func injectTerminalInput(a Attempt) Outcome {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: /dev/ptmx: " + err.Error()}
	}
	defer unix.Close(fd)
	c := byte('x')
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	if errno != 0 {
		return result(a.ID, errno)
	}
	return result(a.ID, nil)
}

// chmodSetUID creates Path and chmods it set-user-id.
func chmodSetUID(a Attempt) Outcome {
	fd, err := unix.Open(a.Path, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o755)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: create " + a.Path + ": " + err.Error()}
	}
	unix.Close(fd)
	defer unix.Unlink(a.Path)
	return result(a.ID, unix.Chmod(a.Path, 0o4755))
}

// connectAbstractSocket connects to the abstract unix socket Arg, which
// no file permission guards.
func connectAbstractSocket(a Attempt) Outcome {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return result(a.ID, err)
	}
	defer unix.Close(fd)
	return result(a.ID, unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + a.Arg}))
}

// connectTCPAttempt connects to the TCP address Arg (Path for `try tcp
// TARGET`).
func connectTCPAttempt(a Attempt) Outcome {
	target := a.Arg
	if target == "" {
		target = a.Path // `try tcp TARGET`
	}
	return result(a.ID, connectTCP(target))
}

// makeUDPSocket makes a UDP socket.
func makeUDPSocket(a Attempt) Outcome {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return result(a.ID, err)
}

// addKey adds a user key to the keyring Arg names: the process's (""),
// the session's or the user's, which every process of the user shares.
func addKey(a Attempt) Outcome {
	ring, ok := map[string]int{"": unix.KEY_SPEC_PROCESS_KEYRING, "process": unix.KEY_SPEC_PROCESS_KEYRING,
		"session": unix.KEY_SPEC_SESSION_KEYRING, "user": unix.KEY_SPEC_USER_KEYRING}[a.Arg]
	if !ok {
		return Outcome{ID: a.ID, Got: "error: keyring " + strconv.Quote(a.Arg)}
	}
	_, err := unix.AddKey("user", "thermite-selftest", []byte("canary"), ring)
	return result(a.ID, err)
}

// makeNetlinkSocket makes a netlink socket of the family Arg.
func makeNetlinkSocket(a Attempt) Outcome {
	proto, err := strconv.Atoi(a.Arg)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: netlink family " + strconv.Quote(a.Arg)}
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err == nil {
		unix.Close(fd)
	}
	return result(a.ID, err)
}

// reportCgroup reports this process's /proc/self/cgroup.
func reportCgroup(a Attempt) Outcome {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return result(a.ID, err)
	}
	return Outcome{ID: a.ID, Got: "ok", Detail: string(data)}
}

// setAffinity asks for the CPUs of a.Arg on this thread and reports what
// the kernel left it: a cpuset cuts the request to its CPUs, and refuses
// one that names none of them (EINVAL).
func setAffinity(a Attempt) Outcome {
	list := a.Arg
	if list == "" {
		list = a.Path
	}
	want, err := cpuset.Parse(list)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: " + err.Error()}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var set unix.CPUSet
	for _, c := range want {
		set.Set(c)
	}
	o := result(a.ID, unix.SchedSetaffinity(0, &set))
	var now unix.CPUSet
	if err := unix.SchedGetaffinity(0, &now); err == nil {
		var got cpuset.Set
		for c := 0; c <= cpuset.MaxCPU && len(got) < now.Count(); c++ {
			if now.IsSet(c) {
				got = append(got, c)
			}
		}
		o.Detail = got.String()
	}
	return o
}

// connectTCP connects a TCP socket to target (a port on 127.0.0.1, or
// ADDRESS:PORT) with raw calls, so the outcome is the errno of socket(2)
// or connect(2) itself. A connect that has no answer within 2 seconds (an
// address beyond this host that drops it) is ETIMEDOUT.
func connectTCP(target string) error {
	host, portS, err := net.SplitHostPort(target)
	if err != nil {
		host, portS = "127.0.0.1", target
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return fmt.Errorf("probe: tcp target %q: %w", target, err)
	}
	ap, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("probe: tcp target %q: %w", target, err)
	}
	family := unix.AF_INET
	var sa unix.Sockaddr
	if ap.Is6() && !ap.Is4In6() {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: port, Addr: ap.As16()}
	} else {
		sa = &unix.SockaddrInet4{Port: port, Addr: ap.Unmap().As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, sa); err != unix.EINPROGRESS {
		return err
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(pfd, 2000)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.ETIMEDOUT
		}
		break
	}
	soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if soErr != 0 {
		return unix.Errno(soErr)
	}
	return nil
}

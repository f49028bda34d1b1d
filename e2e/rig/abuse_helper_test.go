package rig

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/testrig"
)

// The abuse tests act as a role user the way a lane's code would: this
// test binary, copied where every role can run it, started with the
// role's uid and gid and no other group, speaking to api.sock directly.
// What it does is chosen by THERMITE_ATTACK; it reports on stdout, one
// line each, and holds what it opened until its stdin closes.

// TestAttackHelper is the role's side. It runs only in a child the abuse
// tests start.
func TestAttackHelper(t *testing.T) {
	mode := os.Getenv("THERMITE_ATTACK")
	if mode == "" {
		t.Skip("the role's side of the abuse tests: runs only in the child they start")
	}
	os.Exit(attackMain(mode))
}

func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func attackMain(mode string) int {
	sock := os.Getenv("ATTACK_SOCKET")
	token := os.Getenv("ATTACK_TOKEN")
	var held []net.Conn
	switch mode {
	case "idle":
		held = append(held, idleConns(sock, envInt("ATTACK_N"))...)
	case "withheld":
		held = append(held, withheldBodies(sock, token, os.Getenv("ATTACK_PATH"), envInt("ATTACK_N"), int64(envInt("ATTACK_LEN")))...)
	case "oversize":
		oversize(sock, token)
	case "held-note":
		heldNote(sock, token)
	case "prlimit":
		// The controller's own user may lower its limits; root here lacks
		// CAP_SYS_RESOURCE.
		lim := unix.Rlimit{Cur: uint64(envInt("ATTACK_N")), Max: uint64(envInt("ATTACK_N"))}
		if err := unix.Prlimit(envInt("ATTACK_PID"), unix.RLIMIT_NOFILE, &lim, nil); err != nil {
			say("prlimit %v", err)
			return 1
		}
		say("prlimit ok")
		return 0
	case "calls":
		calls(sock, token, envInt("ATTACK_N"))
		return 0
	case "exit":
		// Ends at once; its parent (the test) leaves it unreaped.
		return 0
	case "flood":
		flood(sock, token, time.Duration(envInt("ATTACK_MS"))*time.Millisecond)
		return 0
	case "soak-ordinary":
		soakOrdinary(sock, token)
		return 0
	case "ordinary":
		ordinary(sock, token, envInt("ATTACK_N"))
		return 0
	case "over-runs":
		overRuns(sock, token, envInt("ATTACK_N"))
		return 0
	case "exec-storm":
		execStorm(sock, token, envInt("ATTACK_N"))
		return 0
	case "over-cap":
		overCap(sock, token, envInt("ATTACK_N"))
		return 0
	case "request-flood":
		requestFlood(sock, token, envInt("ATTACK_N"), time.Duration(envInt("ATTACK_MS"))*time.Millisecond)
		return 0
	case "connect-close":
		connectClose(sock, envInt("ATTACK_N"), time.Duration(envInt("ATTACK_MS"))*time.Millisecond)
		return 0
	default:
		say("error unknown mode %q", mode)
		return 2
	}
	say("holding %d", len(held))
	io.Copy(io.Discard, os.Stdin)
	for _, c := range held {
		c.Close()
	}
	return 0
}

// idleConns opens n connections that send nothing, and reports how many
// the controller still keeps open a moment later.
func idleConns(sock string, n int) []net.Conn {
	var conns []net.Conn
	failed := 0
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("unix", sock, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		conns = append(conns, c)
	}
	time.Sleep(500 * time.Millisecond)
	alive := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		var b [1]byte
		_, err := c.Read(b[:])
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			alive++
		}
		c.SetReadDeadline(time.Time{})
	}
	say("idle opened %d alive %d failed %d", len(conns), alive, failed)
	return conns
}

// withheldBodies sends n requests whose bodies stop one byte short of
// their Content-Length, and reports the answers that came at once.
func withheldBodies(sock, token, path string, n int, size int64) []net.Conn {
	var mu sync.Mutex
	var conns []net.Conn
	codes := map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("unix", sock, 2*time.Second)
			if err != nil {
				mu.Lock()
				codes["dial-error"]++
				mu.Unlock()
				return
			}
			c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, token, size)
			body := []byte(`{"path":"big","data":"`)
			chunk := make([]byte, 256<<10)
			for i := range chunk {
				chunk[i] = 'A'
			}
			left := size - 1 - int64(len(body))
			_, err = c.Write(body)
			for err == nil && left > 0 {
				k := min(left, int64(len(chunk)))
				_, err = c.Write(chunk[:k])
				left -= k
			}
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			line, rerr := bufio.NewReader(c).ReadString('\n')
			var code string
			if f := strings.Fields(line); len(f) >= 2 {
				code = f[1]
			} else if ne, ok := rerr.(net.Error); ok && ne.Timeout() {
				code = "held"
			} else {
				code = "closed"
			}
			mu.Lock()
			codes[code]++
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	var parts []string
	for k, v := range codes {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	say("withheld %s", strings.Join(parts, " "))
	return conns
}

// oversize sends only the headers of a step with a 16 MiB Content-Length
// and reports the answer, and how long it took.
func oversize(sock, token string) {
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		say("oversize dial %v", err)
		return
	}
	defer c.Close()
	t0 := time.Now()
	fmt.Fprintf(c, "POST /v1/steps HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n{", token, 16<<20)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		say("oversize no answer in %v: %v", time.Since(t0).Round(time.Millisecond), err)
		return
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	say("oversize %d in %d ms %s", resp.StatusCode, time.Since(t0).Milliseconds(), strings.TrimSpace(string(b)))
}

// heldNote sends a research note all but its last bytes, says "held",
// waits for a line on stdin, then sends the rest and reports the answer.
func heldNote(sock, token string) {
	body := `{"title":"late","body":"written after the trial ended"}`
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		say("note dial %v", err)
		return
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/research/note HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", token, len(body), body[:len(body)-3])
	say("held")
	in := bufio.NewReader(os.Stdin)
	in.ReadString('\n')
	_, werr := io.WriteString(c, body[len(body)-3:])
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		say("note no-answer write=%v read=%v", werr, err)
		return
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	say("note %d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// calls makes n ordinary calls in turn (the trial's details, a step),
// and reports how many succeeded and their p50 and p99 in microseconds.
func calls(sock, token string, n int) {
	// ATTACK_FRESH: a connection of its own for each call, as a tool that
	// runs `thermite trial-client` per call makes.
	fresh := os.Getenv("ATTACK_FRESH") != ""
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: fresh, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	var lat []time.Duration
	ok := 0
	var lastErr string
	for i := 0; i < n; i++ {
		var req *http.Request
		if i%2 == 0 {
			req, _ = http.NewRequest("GET", "http://api/v1/trial", nil)
		} else {
			req, _ = http.NewRequest("POST", "http://api/v1/steps", strings.NewReader(`{"kind":"thought","text":"still served"}`))
		}
		req.Header.Set("Authorization", "Bearer "+token)
		t0 := time.Now()
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok++
			} else {
				lastErr = resp.Status
			}
		} else {
			lastErr = err.Error()
		}
		lat = append(lat, time.Since(t0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	say("calls ok %d of %d p50 %d p99 %d last-error %q", ok, n, p50.Microseconds(), p99.Microseconds(), lastErr)
}

// connectClose connects to sock and closes at once, in a loop on n
// goroutines, until stdin closes or limit passes (so a stuck test cannot
// leave it running). It says "flooding" once it has begun and, at its end,
// how many connects went through, how many failed and why, and what
// stopped it.
// untilClosed runs f over and over on n goroutines (at least one) until
// done closes; the wait it returns waits for all of them to return.
func untilClosed(done <-chan struct{}, n int, f func()) (wait func()) {
	var wg sync.WaitGroup
	for range max(n, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				f()
			}
		}()
	}
	return wg.Wait
}

func connectClose(sock string, n int, limit time.Duration) {
	var mu sync.Mutex
	done := make(chan struct{})
	ok := 0
	failed := map[string]int{}
	t0 := time.Now()
	wait := untilClosed(done, n, func() {
		c, err := net.Dial("unix", sock)
		mu.Lock()
		if err == nil {
			ok++
		} else {
			var errno syscall.Errno
			name := err.Error()
			if errors.As(err, &errno) {
				name = unix.ErrnoName(errno)
			}
			failed[name]++
		}
		mu.Unlock()
		if c != nil {
			c.Close()
		}
	})
	say("flooding")
	stdin := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdin) }()
	by := "stdin"
	select {
	case <-stdin:
	case <-time.After(limit):
		by = "limit"
	}
	close(done)
	wait()
	var parts []string
	for k, v := range failed {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	say("connect-close ok %d ms %d stopped-by %s failed %q", ok, time.Since(t0).Milliseconds(), by, strings.Join(parts, " "))
}

// roleProc is a child running this binary as a role user.
type roleProc struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

var helperCopy sync.Map // rig dir -> path of the copied test binary

// helperBinary is this test binary, copied once per rig where every role
// can run it.
func helperBinary(t testing.TB, r *testrig.Rig) string {
	t.Helper()
	if bin, ok := helperCopy.Load(r.Dir); ok {
		return bin.(string)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(r.Dir, "role-helper.test")
	// No fork of this process (the tests beside it start commands) may
	// happen while the copy is open for writing: a child between its fork
	// and its exec would hold the descriptor, and exec of the copy would
	// fail with ETXTBSY. ForkLock is what os/exec's forks wait on.
	syscall.ForkLock.Lock()
	err = os.WriteFile(p, data, 0o755)
	syscall.ForkLock.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	helperCopy.Store(r.Dir, p)
	return p
}

// startAs starts this test binary as role ("root": as the test's own
// user, as the operator's scripts would run), with THERMITE_ATTACK=mode
// and env. It is killed, by its pid, when the test ends.
func startAs(t testing.TB, r *testrig.Rig, role, mode string, env ...string) *roleProc {
	t.Helper()
	cmd := exec.Command(helperBinary(t, r), "-test.run=^TestAttackHelper$")
	cmd.Dir = r.Dir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "THERMITE_ATTACK=" + mode}, env...)
	if role != "root" {
		u := r.Role(role)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: []uint32{}}}
	}
	return startProc(t, cmd, role)
}

// startThroughBroker starts this test binary as role the way the rig
// starts a role's command (`thermite run-as`: its confinement, its
// cgroup, an agent's own network namespace), with THERMITE_ATTACK=mode
// and env, within timeout. Its stdin and stdout are run-as's.
func startThroughBroker(t testing.TB, r *testrig.Rig, role, mode string, timeout time.Duration, env ...string) *roleProc {
	t.Helper()
	args := []string{"--config", r.Config, "run-as", role, "--timeout", timeout.String(), "--env", "THERMITE_ATTACK=" + mode}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	cmd := exec.Command(r.Bin, append(args, "--", helperBinary(t, r), "-test.run=^TestAttackHelper$")...)
	return startProc(t, cmd, role)
}

// startProc starts cmd with its stdin and stdout piped, as a roleProc.
func startProc(t testing.TB, cmd *exec.Cmd, role string) *roleProc {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the helper as %s: %v", role, err)
	}
	p := &roleProc{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(p.stop)
	return p
}

// expect waits for the child's next line starting with prefix.
func (p *roleProc) expect(prefix string, within time.Duration) string {
	p.t.Helper()
	l, ok := p.next(prefix, within)
	if !ok {
		p.t.Fatalf("the role's process ended before saying %q", prefix)
	}
	return l
}

// next waits for the child's next line starting with prefix; false when
// the child ended first.
func (p *roleProc) next(prefix string, within time.Duration) (string, bool) {
	p.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", false
			}
			if strings.HasPrefix(l, prefix) {
				return l, true
			}
			p.t.Logf("role's process: %s", l)
		case <-deadline:
			p.t.Fatalf("the role's process did not say %q within %v", prefix, within)
		}
	}
}

// send writes a line to the child's stdin.
func (p *roleProc) send(line string) { io.WriteString(p.stdin, line+"\n") }

// stop closes the child's stdin (it lets go of what it holds) and, if it
// has not exited a moment later, kills it by its pid.
func (p *roleProc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// field is the integer after name in a line of words.
func field(t testing.TB, line, name string) int {
	t.Helper()
	f := strings.Fields(line)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == name {
			n, err := strconv.Atoi(f[i+1])
			if err == nil {
				return n
			}
		}
	}
	t.Fatalf("no %s in %q", name, line)
	return 0
}

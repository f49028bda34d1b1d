package fetch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The network tests need a server that Classify calls public yet this
// machine can reach, and that is not an address of the test's own host
// (the fetcher refuses those). TestNetwork re-runs the test binary in a
// fresh network namespace (CLONE_NEWNET, so root): the "host". There it
// makes a second namespace on one locked thread (the "far" side), joins
// the two with a veth pair, puts the documentation address 198.51.100.7
// on the far end and 198.51.100.1 on the host's end, and serves the
// "public" pages from sockets made in the far namespace, beside loopback
// servers on 127.0.0.1 and ::1 with the same port in the host's. The
// machine's own network is never touched, and nothing leaves the
// namespaces.
const (
	netnsChildEnv  = "THERMITE_FETCH_NETNS_CHILD"
	netnsParentEnv = "THERMITE_FETCH_NETNS_PARENT" // the parent's netns inode
	publicV4       = "198.51.100.7"
	publicV6       = "2001:db8::7"
	hostV4         = "198.51.100.1" // the test host's end of the veth pair
	hostV6         = "2001:db8::1"
	// hostLocalNet is a block the test host's routing delivers locally
	// (`ip route add local`), though no interface holds it.
	hostLocalNet  = "203.0.113.0/24"
	hostLocalAddr = "203.0.113.77"
)

// farListen, once setUpNetns has run, listens in the far namespace.
var farListen func(network, address string) (net.Listener, error)

func TestNetwork(t *testing.T) {
	if os.Getenv(netnsChildEnv) != "" {
		runInNetns(t)
		return
	}
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short): the fetch network tests run in a fresh network namespace (CLONE_NEWNET)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2) to set up lo in the test's network namespace")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("the test binary: %v", err)
	}
	cmd := exec.Command(exe, "-test.run=^TestNetwork$", "-test.v", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), netnsChildEnv+"=1", netnsParentEnv+"="+netnsInode(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	// EINVAL: a kernel without network namespaces; EPERM or ENOSPC: a
	// machine (a container, a sysctl) that allows no new one.
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOSPC) {
		t.Skipf("needs a new network namespace (CLONE_NEWNET), which this machine refuses: %v", err)
	}
	if err != nil {
		t.Fatalf("the tests in the network namespace failed (%v):\n%s", err, out)
	}
	if testing.Verbose() {
		t.Logf("in the network namespace:\n%s", out)
	}
	// A child that ran nothing exits 0 too: insist it ran and passed.
	passed, skipped := 0, 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "--- PASS: TestNetwork/"):
			passed++
		case strings.HasPrefix(line, "--- SKIP: TestNetwork/"):
			skipped++
			t.Log(line)
		}
	}
	if !bytes.Contains(out, []byte("--- PASS: TestNetwork ")) || passed < 10 {
		t.Fatalf("the namespace run passed %d subtests; want TestNetwork and at least 10:\n%s", passed, out)
	}
	t.Logf("%d subtests passed and %d skipped in the network namespace", passed, skipped)
}

func netnsInode(t *testing.T) string {
	t.Helper()
	fi, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("network namespace: %v", err)
	}
	return strconv.FormatUint(fi.Sys().(*syscall.Stat_t).Ino, 10)
}

// setUpNetns changes nothing unless this process is in a namespace other
// than its parent's and that namespace is still untouched.
func setUpNetns(t *testing.T) (v6 bool) {
	parent := os.Getenv(netnsParentEnv)
	if parent == "" || parent == netnsInode(t) {
		t.Fatalf("%s is set but this is not a fresh network namespace: refusing to change the network", netnsChildEnv)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatalf("interfaces: %v", err)
	}
	for _, ifc := range ifs {
		if addrs, _ := ifc.Addrs(); ifc.Flags&net.FlagUp != 0 || len(addrs) > 0 {
			t.Fatalf("interface %s is up or has addresses: not a fresh namespace, refusing to change it", ifc.Name)
		}
	}
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	farNS := startFarNetns(t)
	far := func(args ...string) error {
		a := append([]string{"--net=" + farNS, "ip"}, args...)
		out, err := exec.Command("nsenter", a...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nsenter %s: %v: %s", strings.Join(a, " "), err, out)
		}
		return nil
	}
	for _, step := range []func() error{
		func() error { return ip("link", "set", "lo", "up") },
		func() error { return ip("link", "add", "name", "th-host", "type", "veth", "peer", "name", "th-far") },
		func() error { return ip("link", "set", "th-far", "netns", farNS) },
		func() error { return ip("addr", "add", hostV4+"/24", "dev", "th-host") },
		func() error { return ip("link", "set", "th-host", "up") },
		func() error { return ip("route", "add", "local", hostLocalNet, "dev", "lo") },
		func() error { return far("link", "set", "lo", "up") },
		func() error { return far("addr", "add", publicV4+"/24", "dev", "th-far") },
		func() error { return far("link", "set", "th-far", "up") },
	} {
		if err := step(); err != nil {
			t.Fatalf("setting up the namespaces (needs veth): %v", err)
		}
	}
	if err := ip("-6", "addr", "add", hostV6+"/64", "dev", "th-host", "nodad"); err != nil {
		t.Logf("no IPv6 in the namespace: %v", err)
		return false
	}
	if err := far("-6", "addr", "add", publicV6+"/64", "dev", "th-far", "nodad"); err != nil {
		t.Logf("no IPv6 in the far namespace: %v", err)
		return false
	}
	return true
}

// startFarNetns makes the far namespace: one goroutine locks its thread
// and unshares CLONE_NEWNET, so that thread, and every socket made on it,
// is there. It then makes the listeners farListen asks for, and never
// unlocks: the thread, and the namespace with it, go when the process
// does. It returns the namespace's path for ip and nsenter.
func startFarNetns(t *testing.T) string {
	type req struct {
		network, address string
		done             chan error
		l                net.Listener
	}
	reqs := make(chan *req)
	ready := make(chan error)
	var path string
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the namespace on it
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare(CLONE_NEWNET) on a locked thread: %w", err)
			return
		}
		path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), syscall.Gettid())
		ready <- nil
		for r := range reqs {
			var err error
			r.l, err = net.Listen(r.network, r.address)
			r.done <- err
		}
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	farListen = func(network, address string) (net.Listener, error) {
		r := &req{network: network, address: address, done: make(chan error)}
		reqs <- r
		return r.l, <-r.done
	}
	return path
}

// countingListener counts the connections it accepts: a refused fetch must
// leave a loopback server's count at zero.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// serveOn serves h on address: in the far namespace for the public
// addresses, in the test host's for every other.
func serveOn(t *testing.T, network, address string, h http.Handler) (*httptest.Server, *countingListener, error) {
	listen := net.Listen
	if host, _, _ := net.SplitHostPort(address); (host == publicV4 || host == publicV6) && farListen != nil {
		listen = farListen
	}
	l, err := listen(network, address)
	if err != nil {
		return nil, nil, err
	}
	cl := &countingListener{Listener: l}
	s := httptest.NewUnstartedServer(h)
	s.Listener.Close()
	s.Listener = cl
	s.Start()
	t.Cleanup(s.Close)
	return s, cl, nil
}

// fakeDNS answers A and AAAA queries from a table, over UDP on 127.0.0.1;
// the Go resolver is pointed at it, so names resolve with no real DNS.
type fakeDNS struct {
	conn net.PacketConn

	mu      sync.Mutex
	rebindA int // A queries for rebind.test so far
}

func startFakeDNS(t *testing.T) *fakeDNS {
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("fake DNS: %v", err)
	}
	d := &fakeDNS{conn: conn}
	t.Cleanup(func() { conn.Close() })
	go d.serve()
	return d
}

// resolver is a Go resolver that asks only the fake server. (The server
// is on 127.0.0.1, which is fine: DNS traffic is the resolver's own, not a
// fetch's, and never passes the fetch dial check.)
func (d *fakeDNS) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "udp4", d.conn.LocalAddr().String())
	}}
}

const (
	typeA    = 1
	typeAAAA = 28
)

// lookup is the fake zone. rebind.test is the DNS-rebinding attacker: its
// first A answer is public, every later one is 127.0.0.1.
func (d *fakeDNS) lookup(name string, qtype uint16) (addrs []netip.Addr, known bool) {
	one := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	switch {
	case name == "public.test" && qtype == typeA:
		return one(publicV4), true
	case name == "loop.test" && qtype == typeA:
		return one("127.0.0.1"), true
	case name == "loop6.test" && qtype == typeAAAA:
		return one("::1"), true
	case name == "private.test" && qtype == typeA:
		return one("10.1.2.3"), true
	case name == "rebind.test" && qtype == typeA:
		d.mu.Lock()
		defer d.mu.Unlock()
		d.rebindA++
		if d.rebindA == 1 {
			return one(publicV4), true
		}
		return one("127.0.0.1"), true
	case name == "public.test", name == "loop.test", name == "loop6.test", name == "private.test", name == "rebind.test":
		return nil, true // the name exists, without records of this type
	}
	return nil, false
}

func (d *fakeDNS) rebindQueries() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rebindA
}

func (d *fakeDNS) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := d.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp := d.answer(buf[:n]); resp != nil {
			d.conn.WriteTo(resp, from)
		}
	}
}

// answer builds the reply to one query (RFC 1035 4.1): the query's id and
// question, then the answers, each naming the question by a pointer.
func (d *fakeDNS) answer(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	off := 12
	var labels []string
	for {
		if off >= len(q) {
			return nil
		}
		l := int(q[off])
		off++
		if l == 0 {
			break
		}
		if l&0xc0 != 0 || off+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[off:off+l]))
		off += l
	}
	if off+4 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[off:])
	off += 4
	addrs, known := d.lookup(strings.ToLower(strings.Join(labels, ".")), qtype)

	flags := uint16(0x8000 | 0x0400 | 0x0080) // response, authoritative, recursion available
	flags |= uint16(q[2]&0x01) << 8           // recursion desired, echoed
	if !known {
		flags |= 3 // NXDOMAIN
	}
	resp := append([]byte{}, q[0], q[1])
	resp = binary.BigEndian.AppendUint16(resp, flags)
	resp = binary.BigEndian.AppendUint16(resp, 1)
	resp = binary.BigEndian.AppendUint16(resp, uint16(len(addrs)))
	resp = append(resp, 0, 0, 0, 0)
	resp = append(resp, q[12:off]...)
	for _, a := range addrs {
		typ := uint16(typeA)
		if a.Is6() {
			typ = typeAAAA
		}
		resp = append(resp, 0xc0, 12)
		resp = binary.BigEndian.AppendUint16(resp, typ)
		resp = binary.BigEndian.AppendUint16(resp, 1) // IN
		resp = append(resp, 0, 0, 0, 0)               // TTL 0
		raw := a.AsSlice()
		resp = binary.BigEndian.AppendUint16(resp, uint16(len(raw)))
		resp = append(resp, raw...)
	}
	return resp
}

const publicPage = "<p>a public page</p>"

// publicHandler is the "public" site on 198.51.100.7.
func publicHandler(port string, hops *atomic.Int64) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/page", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, publicPage)
	})
	mux.HandleFunc("/ua", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.UserAgent())
	})
	mux.HandleFunc("/missing", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such page", http.StatusNotFound)
	})
	redirect := func(path, to string) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			hops.Add(1)
			http.Redirect(w, r, to, http.StatusFound)
		})
	}
	// /redirect?to=URL: one hop to any URL.
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		hops.Add(1)
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	redirect("/to-loopback", "http://127.0.0.1:"+port+"/secret")
	redirect("/to-loop-name", "http://loop.test:"+port+"/secret")
	redirect("/to-mapped", "http://[::ffff:127.0.0.1]:"+port+"/secret")
	redirect("/to-ftp", "ftp://"+publicV4+"/file")
	redirect("/to-file", "file:///etc/passwd")
	redirect("/to-userinfo", "http://user:pw@"+publicV4+":"+port+"/page")
	// /chain/N redirects N times, then serves a page.
	mux.HandleFunc("/chain/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		if n <= 0 {
			io.WriteString(w, "end of the chain")
			return
		}
		http.Redirect(w, r, fmt.Sprintf("/chain/%d", n-1), http.StatusFound)
	})
	// /big?n=N: N bytes with a Content-Length; /stream?n=N: chunked, no length.
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(bytes.Repeat([]byte("x"), n))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		for ; n > 0; n -= 256 {
			w.Write(bytes.Repeat([]byte("y"), min(n, 256)))
			w.(http.Flusher).Flush()
		}
	})
	wait := func(r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}
	mux.HandleFunc("/slow-headers", func(w http.ResponseWriter, r *http.Request) {
		wait(r)
	})
	mux.HandleFunc("/slow-body", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "the start, ")
		w.(http.Flusher).Flush()
		wait(r)
	})
	return mux
}

func runInNetns(t *testing.T) {
	v6 := setUpNetns(t)
	ctx := context.Background()

	var hops atomic.Int64
	// The public server picks the port; the loopback servers take the same
	// one, so every refused URL names a port something really listens on.
	pubLn, err := farListen("tcp4", publicV4+":0")
	if err != nil {
		t.Fatalf("listen on %s: %v", publicV4, err)
	}
	port := strconv.Itoa(pubLn.Addr().(*net.TCPAddr).Port)
	pubLn.Close()
	public := net.JoinHostPort(publicV4, port)
	if _, _, err := serveOn(t, "tcp4", public, publicHandler(port, &hops)); err != nil {
		t.Fatalf("public server: %v", err)
	}
	secret := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "loopback secret") })
	_, loop4, err := serveOn(t, "tcp4", "127.0.0.1:"+port, secret)
	if err != nil {
		t.Fatalf("loopback server: %v", err)
	}
	var loop6 *countingListener
	if v6 {
		if _, loop6, err = serveOn(t, "tcp6", "[::1]:"+port, secret); err != nil {
			t.Fatalf("loopback server on ::1: %v", err)
		}
	}
	loopHits := func() int64 {
		n := loop4.accepted.Load()
		if loop6 != nil {
			n += loop6.accepted.Load()
		}
		return n
	}
	dns := startFakeDNS(t)
	res := dns.resolver()
	f := &Fetcher{Resolver: res, Timeout: 5 * time.Second}

	// The refusals below mean something only if the loopback server is
	// really there: an ordinary client reaches it.
	t.Run("loopback server is reachable without the fetcher", func(t *testing.T) {
		c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
		urls := []string{"http://127.0.0.1:" + port + "/"}
		if loop6 != nil {
			urls = append(urls, "http://[::1]:"+port+"/")
		}
		for _, u := range urls {
			resp, err := c.Get(u)
			if err != nil {
				t.Fatalf("GET %s: %v", u, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "loopback secret" {
				t.Fatalf("GET %s: %q", u, b)
			}
		}
		c.CloseIdleConnections()
		loop4.accepted.Store(0)
		if loop6 != nil {
			loop6.accepted.Store(0)
		}
	})

	refusedCase := func(name, rawURL, host, addr, class string) {
		t.Run(name, func(t *testing.T) {
			before := loopHits()
			_, err := f.Fetch(ctx, rawURL)
			checkRefused(t, err, rawURL, addr, class)
			var refused *RefusedError
			if errors.As(err, &refused) && refused.Host != host {
				t.Errorf("Host %q; want %q", refused.Host, host)
			}
			if n := loopHits() - before; n != 0 {
				t.Errorf("the loopback server accepted %d connections", n)
			}
		})
	}
	refusedCase("name resolving to 127.0.0.1", "http://loop.test:"+port+"/secret", "loop.test", "127.0.0.1", "loopback")
	refusedCase("name resolving to ::1", "http://loop6.test:"+port+"/secret", "loop6.test", "::1", "loopback")
	refusedCase("name resolving to 10.1.2.3", "http://private.test:"+port+"/", "private.test", "10.1.2.3", "private")
	refusedCase("127.0.0.1", "http://127.0.0.1:"+port+"/secret", "127.0.0.1", "127.0.0.1", "loopback")
	refusedCase("127.1", "http://127.1:"+port+"/secret", "127.1", "127.0.0.1", "loopback")
	refusedCase("0x7f000001", "http://0x7f000001:"+port+"/secret", "0x7f000001", "127.0.0.1", "loopback")
	refusedCase("[::ffff:127.0.0.1]", "http://[::ffff:127.0.0.1]:"+port+"/secret", "::ffff:127.0.0.1", "::ffff:127.0.0.1", "ipv4-mapped")
	refusedCase("0.0.0.0", "http://0.0.0.0:"+port+"/secret", "0.0.0.0", "0.0.0.0", "unspecified")
	refusedCase("[::1]", "http://[::1]:"+port+"/secret", "::1", "::1", "loopback")
	refusedCase("https to 127.0.0.1", "https://127.0.0.1:"+port+"/secret", "127.0.0.1", "127.0.0.1", "loopback")

	// The redirect's first hop is served; the second is refused, and the
	// refusal names the hop, not the URL asked for.
	redirectCase := func(name, path, hopURL, host, addr, class string) {
		t.Run(name, func(t *testing.T) {
			before, hopsBefore := loopHits(), hops.Load()
			_, err := f.Fetch(ctx, "http://"+public+path)
			checkRefused(t, err, hopURL, addr, class)
			var refused *RefusedError
			if errors.As(err, &refused) && refused.Host != host {
				t.Errorf("Host %q; want %q", refused.Host, host)
			}
			if hops.Load() != hopsBefore+1 {
				t.Errorf("the public server served %d first hops; want 1", hops.Load()-hopsBefore)
			}
			if n := loopHits() - before; n != 0 {
				t.Errorf("the loopback server accepted %d connections", n)
			}
		})
	}
	redirectCase("redirect to 127.0.0.1", "/to-loopback", "http://127.0.0.1:"+port+"/secret", "127.0.0.1", "127.0.0.1", "loopback")
	redirectCase("redirect to a name resolving to 127.0.0.1", "/to-loop-name", "http://loop.test:"+port+"/secret", "loop.test", "127.0.0.1", "loopback")
	redirectCase("redirect to ::ffff:127.0.0.1", "/to-mapped", "http://[::ffff:127.0.0.1]:"+port+"/secret", "::ffff:127.0.0.1", "::ffff:127.0.0.1", "ipv4-mapped")

	// Issue 13, point 4: a server on 0.0.0.0 answers on every address of
	// the host, public ranges too. Each such address is refused, asked for
	// or redirected to, and so is one a `local` route delivers to the host
	// though no interface holds it.
	t.Run("fetch of the host's own non-loopback address refused", func(t *testing.T) {
		own, ownHits, err := serveOn(t, "tcp4", "0.0.0.0:0", secret)
		if err != nil {
			t.Fatalf("a server on 0.0.0.0: %v", err)
		}
		ownPort := strconv.Itoa(own.Listener.Addr().(*net.TCPAddr).Port)
		targets := []string{hostV4, hostLocalAddr}
		hits := func() int64 { return ownHits.accepted.Load() }
		if v6 {
			_, own6Hits, err := serveOn(t, "tcp6", "[::]:"+ownPort, secret)
			if err != nil {
				t.Fatalf("a server on [::]: %v", err)
			}
			targets = append(targets, hostV6)
			hits = func() int64 { return ownHits.accepted.Load() + own6Hits.accepted.Load() }
		}
		// The server answers an ordinary client on each address: the
		// refusals below are the fetcher's.
		c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
		for _, h := range targets {
			u := "http://" + net.JoinHostPort(h, ownPort) + "/"
			resp, err := c.Get(u)
			if err != nil {
				t.Fatalf("GET %s without the fetcher: %v", u, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "loopback secret" {
				t.Fatalf("GET %s without the fetcher: %q", u, b)
			}
		}
		c.CloseIdleConnections()
		before := hits()
		for _, h := range targets {
			u := "http://" + net.JoinHostPort(h, ownPort) + "/secret"
			_, err := f.Fetch(ctx, u)
			checkRefused(t, err, u, h, ClassHost)
			// A redirect to it: the first hop is served, the second refused.
			hopsBefore := hops.Load()
			_, err = f.Fetch(ctx, "http://"+public+"/redirect?to="+url.QueryEscape(u))
			checkRefused(t, err, u, h, ClassHost)
			if hops.Load() != hopsBefore+1 {
				t.Errorf("the public server served %d first hops; want 1", hops.Load()-hopsBefore)
			}
		}
		if n := hits() - before; n != 0 {
			t.Errorf("the host's own server accepted %d connections from the fetcher", n)
		}
		// The public server is not one of the host's: it is fetched.
		if own, err := HostAddress(netip.MustParseAddr(publicV4)); own || err != nil {
			t.Errorf("HostAddress(%s) = %v, %v; want false: it is the far namespace's", publicV4, own, err)
		}
	})

	t.Run("DNS rebinding", func(t *testing.T) {
		// The attacker's name answers a public address first, then
		// 127.0.0.1. The first fetch is served; the second dials what DNS
		// says now, and the dial-time check refuses it.
		u := "http://rebind.test:" + port + "/page"
		before := loopHits()
		page, err := f.Fetch(ctx, u)
		if err != nil || string(page.Body) != publicPage {
			t.Fatalf("first fetch (DNS says %s): %v", publicV4, err)
		}
		_, err = f.Fetch(ctx, u)
		checkRefused(t, err, u, "127.0.0.1", "loopback")
		if n := dns.rebindQueries(); n != 2 {
			t.Errorf("%d A queries for rebind.test; want 2 (one per dial)", n)
		}
		if n := loopHits() - before; n != 0 {
			t.Errorf("the loopback server accepted %d connections", n)
		}
	})

	t.Run("the refusal comes from the dialer's Control", func(t *testing.T) {
		// A bare net.Dialer with only dialControl: the resolver hands it
		// 127.0.0.1 and the check on the socket address stops the connect.
		before := loopHits()
		d := &net.Dialer{Resolver: res, Control: dialControl}
		c, err := d.DialContext(ctx, "tcp", "loop.test:"+port)
		if err == nil {
			c.Close()
			t.Fatal("dialed loop.test")
		}
		var op *net.OpError
		var refused *RefusedError
		if !errors.As(err, &op) || op.Op != "dial" || !errors.As(err, &refused) || refused.Class != "loopback" {
			t.Errorf("dial loop.test: %v; want a dial error wrapping a loopback refusal", err)
		}
		if n := loopHits() - before; n != 0 {
			t.Errorf("the loopback server accepted %d connections", n)
		}
		if c, err := d.DialContext(ctx, "tcp", "public.test:"+port); err != nil {
			t.Errorf("dial public.test: %v", err)
		} else {
			c.Close()
		}
	})

	t.Run("public page fetched and archived", func(t *testing.T) {
		for _, u := range []string{"http://public.test:" + port + "/page", "http://" + public + "/page"} {
			start := time.Now().UTC()
			page, err := f.Fetch(ctx, u)
			if err != nil {
				t.Fatalf("Fetch(%s): %v", u, err)
			}
			if page.URL != u || page.Requested != u || page.Status != 200 ||
				page.ContentType != "text/html; charset=utf-8" || string(page.Body) != publicPage || page.Truncated {
				t.Errorf("Fetch(%s): %+v", u, page)
			}
			if page.FetchedAt.Before(start) || page.FetchedAt.After(time.Now()) || page.FetchedAt.Location() != time.UTC {
				t.Errorf("FetchedAt %v; want between %v and now, UTC", page.FetchedAt, start)
			}
			dir := filepath.Join(t.TempDir(), "research")
			path, err := Archive(dir, page)
			if err != nil {
				t.Fatalf("Archive: %v", err)
			}
			if b, err := os.ReadFile(path); err != nil || string(b) != publicPage {
				t.Errorf("archived body %q, %v", b, err)
			}
			m := readMeta(t, strings.TrimSuffix(path, ".body")+".json")
			if m.URL != u || m.Requested != u || m.Status != 200 || m.ContentType != page.ContentType ||
				m.Size != len(publicPage) || !m.FetchedAt.Equal(page.FetchedAt) || m.Body != filepath.Base(path) {
				t.Errorf("metadata %+v", m)
			}
		}
	})

	t.Run("redirects followed within MaxRedirects", func(t *testing.T) {
		page, err := f.Fetch(ctx, "http://"+public+"/chain/5")
		if err != nil || page.URL != "http://"+public+"/chain/0" || page.Requested != "http://"+public+"/chain/5" {
			t.Fatalf("Fetch(/chain/5): %+v, %v", page, err)
		}
		_, err = f.Fetch(ctx, "http://"+public+"/chain/6")
		if !errors.Is(err, ErrTooManyRedirects) || HTTPStatus(err) != http.StatusBadGateway {
			t.Errorf("Fetch(/chain/6): %v (status %d); want too many redirects, 502", err, HTTPStatus(err))
		}
		none := &Fetcher{Resolver: res, MaxRedirects: -1}
		if _, err := none.Fetch(ctx, "http://"+public+"/chain/1"); !errors.Is(err, ErrTooManyRedirects) {
			t.Errorf("MaxRedirects -1, Fetch(/chain/1): %v; want too many redirects", err)
		}
	})

	t.Run("redirect to a bad scheme or userinfo", func(t *testing.T) {
		for _, c := range []struct{ path, says string }{
			{"/to-ftp", `scheme "ftp"`}, {"/to-file", `scheme "file"`}, {"/to-userinfo", "userinfo"},
		} {
			_, err := f.Fetch(ctx, "http://"+public+c.path)
			var bad *BadURLError
			if !errors.As(err, &bad) || !strings.Contains(err.Error(), c.says) || HTTPStatus(err) != http.StatusBadRequest {
				t.Errorf("Fetch(%s): %v; want a 400 saying %s", c.path, err, c.says)
			}
		}
	})

	t.Run("non-2xx pages are pages", func(t *testing.T) {
		page, err := f.Fetch(ctx, "http://"+public+"/missing")
		if err != nil || page.Status != http.StatusNotFound {
			t.Errorf("Fetch(/missing): %+v, %v; want status 404 and no error", page, err)
		}
	})

	t.Run("user agent", func(t *testing.T) {
		for _, c := range []struct{ set, want string }{{"", DefaultUserAgent}, {"rig-research/2", "rig-research/2"}} {
			page, err := (&Fetcher{Resolver: res, UserAgent: c.set}).Fetch(ctx, "http://"+public+"/ua")
			if err != nil || string(page.Body) != c.want {
				t.Errorf("UserAgent %q: server saw %q, %v", c.set, page.Body, err)
			}
		}
	})

	t.Run("proxy from the environment is ignored", func(t *testing.T) {
		var proxyHits atomic.Int64
		proxy, _, err := serveOn(t, "tcp4", publicV4+":0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			proxyHits.Add(1)
			io.WriteString(w, "via the proxy")
		}))
		if err != nil {
			t.Fatalf("proxy server: %v", err)
		}
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
			t.Setenv(k, proxy.URL)
		}
		t.Setenv("NO_PROXY", "")
		t.Setenv("no_proxy", "")

		page, err := f.Fetch(ctx, "http://"+public+"/page")
		if err != nil || string(page.Body) != publicPage {
			t.Fatalf("Fetch with a proxy in the environment: %v", err)
		}
		if n := proxyHits.Load(); n != 0 {
			t.Fatalf("the proxy got %d requests; want 0", n)
		}
		// The environment is live: a client that honours it goes through
		// the proxy, so the zero above is the fetcher's doing.
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment}}
		resp, err := c.Get("http://" + public + "/page")
		if err != nil {
			t.Fatalf("GET through the environment's proxy: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "via the proxy" || proxyHits.Load() != 1 {
			t.Errorf("a client honouring the environment got %q and the proxy %d hits; want the proxy's answer and 1",
				b, proxyHits.Load())
		}
	})

	t.Run("body over MaxBytes", func(t *testing.T) {
		small := &Fetcher{Resolver: res, MaxBytes: 1024}
		for _, path := range []string{"/big?n=1025", "/stream?n=4096", "/big?n=1000000"} {
			_, err := small.Fetch(ctx, "http://"+public+path)
			var tooLarge *TooLargeError
			if !errors.As(err, &tooLarge) || tooLarge.Limit != 1024 || HTTPStatus(err) != http.StatusRequestEntityTooLarge ||
				!strings.Contains(err.Error(), "1024-byte limit") {
				t.Errorf("Fetch(%s): %v; want a 413 naming the 1024-byte limit", path, err)
			}
		}
		for _, path := range []string{"/big?n=1024", "/stream?n=1024"} {
			page, err := small.Fetch(ctx, "http://"+public+path)
			if err != nil || len(page.Body) != 1024 || page.Truncated {
				t.Errorf("Fetch(%s) of exactly MaxBytes: %v", path, err)
			}
		}
		cut := &Fetcher{Resolver: res, MaxBytes: 1024, Truncate: true}
		for _, path := range []string{"/big?n=5000", "/stream?n=5000"} {
			page, err := cut.Fetch(ctx, "http://"+public+path)
			if err != nil || len(page.Body) != 1024 || !page.Truncated {
				t.Errorf("Truncate, Fetch(%s): %v; want 1024 bytes, Truncated", path, err)
				continue
			}
			dir := t.TempDir()
			path, err := Archive(dir, page)
			if err != nil {
				t.Fatalf("Archive: %v", err)
			}
			if m := readMeta(t, strings.TrimSuffix(path, ".body")+".json"); !m.Truncated || m.Size != 1024 {
				t.Errorf("metadata of a truncated page: %+v", m)
			}
		}
	})

	t.Run("slow server hits Timeout", func(t *testing.T) {
		slow := &Fetcher{Resolver: res, Timeout: 300 * time.Millisecond}
		for _, path := range []string{"/slow-headers", "/slow-body"} {
			start := time.Now()
			_, err := slow.Fetch(ctx, "http://"+public+path)
			took := time.Since(start)
			var timeout *TimeoutError
			if !errors.As(err, &timeout) || HTTPStatus(err) != http.StatusGatewayTimeout || timeout.Limit != 300*time.Millisecond {
				t.Errorf("Fetch(%s): %v; want a 504 naming the 300ms limit", path, err)
			}
			if took < 300*time.Millisecond || took > 3*time.Second {
				t.Errorf("Fetch(%s) took %v; want about 300ms", path, took)
			}
		}
		// The caller's own cancellation is not our timeout.
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := f.Fetch(cctx, "http://"+public+"/slow-headers")
		var timeout *TimeoutError
		if err == nil || errors.As(err, &timeout) {
			t.Errorf("Fetch with the caller's deadline: %v; want a plain error, not *TimeoutError", err)
		}
	})

	t.Run("IPv6 public address", func(t *testing.T) {
		if !v6 {
			t.Skip("IPv6 is unavailable in the test namespace: could not add " + publicV6 + " to lo")
		}
		s, _, err := serveOn(t, "tcp6", "["+publicV6+"]:0", publicHandler(port, &hops))
		if err != nil {
			t.Fatalf("listen on %s: %v", publicV6, err)
		}
		page, err := f.Fetch(ctx, s.URL+"/page")
		if err != nil || string(page.Body) != publicPage {
			t.Errorf("Fetch(%s/page): %v", s.URL, err)
		}
	})

	t.Run("no connection ever reached the loopback servers", func(t *testing.T) {
		if n := loopHits(); n != 0 {
			t.Errorf("the loopback servers accepted %d connections", n)
		}
	})
}

package rig

import (
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// egressEvent is one egress or egress.refused event of the ledger.
type egressEvent struct {
	Kind  string `json:"kind"`
	Trial string `json:"trial"`
	Data  struct {
		Target string `json:"target"`
		Via    string `json:"via"`
		Why    string `json:"why"`
	} `json:"data"`
}

// egressEvents are the ledger's egress events for target, waiting a while
// for a tunnel's (recorded when it closes).
func egressEvents(t *testing.T, r *testrig.Rig, kind, target string, want int) []egressEvent {
	t.Helper()
	var got []egressEvent
	for range 50 {
		got = nil
		out, _, _ := r.Thermite("ledger", "export")
		for _, line := range strings.Split(out, "\n") {
			var e egressEvent
			// The export holds one record a line, each but the last
			// followed by a comma.
			line = strings.TrimSuffix(strings.TrimSpace(line), ",")
			if json.Unmarshal([]byte(line), &e) == nil && e.Kind == kind && e.Data.Target == target {
				got = append(got, e)
			}
		}
		if len(got) >= want {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return got
}

// egressRig is a rig whose agent.egress lists one local TLS server, a
// stand-in for a model provider on 127.0.0.1 of the host's namespace,
// with a second one, unlisted, counting what reaches it.
func egressRig(t *testing.T) (r *testrig.Rig, provider *httptest.Server, port string, unlisted *httptest.Server, hits *atomic.Int64) {
	provider = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "provider says hi") }))
	t.Cleanup(provider.Close)
	_, port, _ = net.SplitHostPort(provider.Listener.Addr().String())
	hits = new(atomic.Int64)
	unlisted = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "unlisted") }))
	unlisted.Config.ConnState = func(net.Conn, http.ConnState) { hits.Add(1) }
	unlisted.StartTLS()
	t.Cleanup(unlisted.Close)
	r = testrig.New(t, testrig.Options{Extra: "\n[agent]\negress = [\"127.0.0.1:" + port + "\"]\n"})
	return r, provider, port, unlisted, hits
}

// curlArgv runs curl as an agent's HTTPS client would: the provider's CA
// written to a file first, HTTPS_PROXY from the environment thermite gave.
func curlArgv(provider *httptest.Server, url string) []string {
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: provider.Certificate().Raw}))
	return []string{"sh", "-c", `d=$(mktemp -d) && printf '%s' "$1" > "$d/ca.pem" && exec curl -sS --max-time 10 --cacert "$d/ca.pem" "$2"`, "sh", ca, url}
}

// TestAgentReachesProviderOnlyThroughItsProxy: an agent, given
// HTTPS_PROXY, reaches the listed provider with a real HTTPS client
// (curl) through its own proxy, and the tunnel is recorded for its trial;
// an unlisted host gets the proxy's 403 and nothing reaches it; the agent
// connecting straight to the provider, to the API's TCP port, to any
// other port of 127.0.0.1 or to an address beyond lo fails with the
// kernel's exact refusal; its proxy is the one TCP address it reaches.
func TestAgentReachesProviderOnlyThroughItsProxy(t *testing.T) {
	r, provider, port, unlisted, hits := egressRig(t)
	proxy := "127.0.0.1:3128"

	// Before any trial: the self-test runs on an idle rig.
	t.Run("the self-test's egress rows run for every agent and hold", func(t *testing.T) {
		res, code := selftestJSON(t, r)
		if code != 0 || !res.Holds {
			t.Fatalf("self-test: exit %d %s", code, res.Sentence)
		}
		want := map[string]string{
			"reach a TCP address other than its egress proxy":                        "ECONNREFUSED",
			"reach an address beyond this host on its egress proxy's port":           "ENETUNREACH",
			"connect to the broker's abstract unix socket from its egress namespace": "ECONNREFUSED",
			"connect to the harness API's TCP port":                                  "EACCES",
		}
		// The lane harness: every lane probed again in egress mode, its
		// lane rows (the judge's places among them) and these.
		want["read the ledger"] = "EACCES"
		want["read a kit"] = "EACCES"
		seen := map[string]int{}
		for _, p := range res.Probes {
			for a, errno := range want {
				harness := strings.HasSuffix(p.Role, " as the lane harness")
				judges := a == "read the ledger" || a == "read a kit"
				if strings.HasPrefix(p.Attempt, a) && (harness || (!judges && strings.HasPrefix(p.Role, "agent-"))) {
					seen[a]++
					if !p.OK || p.Got != errno {
						t.Errorf("%s %s: %q, want %s", p.Role, p.Attempt, p.Got, errno)
					}
				}
			}
		}
		for a := range want {
			if n := map[bool]int{true: 2, false: 4}[a == "read the ledger" || a == "read a kit"]; seen[a] != n {
				t.Errorf("%q ran for %d of the agents and lane harnesses, want %d", a, seen[a], n)
			}
		}
	})

	info, _ := startTrial(t, r, 1, makeProject(t, r))

	t.Run("the environment names the proxy and nothing bypasses it", func(t *testing.T) {
		out, stderr, code := r.Thermite("trial", "agent", info.ID, "--", "sh", "-c", `echo "[$HTTPS_PROXY|$HTTP_PROXY|$https_proxy|$http_proxy|${NO_PROXY-unset}|${no_proxy-unset}]"`)
		want := "[http://" + proxy + "|http://" + proxy + "|http://" + proxy + "|http://" + proxy + "||]"
		if code != 0 || strings.TrimSpace(out) != want {
			t.Fatalf("agent's environment: exit %d %q %s, want %q", code, out, stderr, want)
		}
	})

	t.Run("the listed provider, through HTTPS_PROXY, recorded for the trial", func(t *testing.T) {
		out, stderr, code := r.Thermite(append([]string{"trial", "agent", info.ID, "--"}, curlArgv(provider, "https://127.0.0.1:"+port+"/")...)...)
		if code != 0 || out != "provider says hi" {
			t.Fatalf("curl through the proxy: exit %d %q %s", code, out, stderr)
		}
		ev := egressEvents(t, r, "egress", "127.0.0.1:"+port, 1)
		if len(ev) == 0 || ev[0].Trial != info.ID || ev[0].Data.Via != "agent-1" {
			t.Fatalf("egress events %+v, want one of trial %s via agent-1", ev, info.ID)
		}
	})

	t.Run("an unlisted host gets 403 and nothing reaches it", func(t *testing.T) {
		_, uport, _ := net.SplitHostPort(unlisted.Listener.Addr().String())
		before := hits.Load()
		_, stderr, code := r.Thermite(append([]string{"trial", "agent", info.ID, "--"}, curlArgv(unlisted, "https://127.0.0.1:"+uport+"/")...)...)
		if code == 0 || !strings.Contains(stderr, "403") {
			t.Fatalf("curl to an unlisted host: exit %d %s, want the proxy's 403", code, stderr)
		}
		if n := hits.Load() - before; n != 0 {
			t.Fatalf("%d connections reached the unlisted host", n)
		}
		if ev := egressEvents(t, r, "egress.refused", "127.0.0.1:"+uport, 1); len(ev) == 0 || ev[0].Trial != info.ID {
			t.Fatalf("no egress.refused event for trial %s: %+v", info.ID, ev)
		}
	})

	t.Run("every TCP address but the proxy fails with the exact errno", func(t *testing.T) {
		api := apiTCPPort(t, r)
		for _, c := range []struct{ target, want, why string }{
			{"127.0.0.1:" + port, "EACCES", "the provider itself, bypassing the proxy: Landlock allows the proxy's port alone"},
			{"127.0.0.1:" + api, "EACCES", "the harness API's TCP port"},
			{"127.0.0.1:22", "EACCES", "another port of 127.0.0.1"},
			{"[::1]:" + port, "EACCES", "the provider's port on ::1"},
			{"203.0.113.1:3128", "ENETUNREACH", "an address beyond lo on the proxy's own port: the namespace has no route"},
			{"127.0.0.2:3128", "ECONNREFUSED", "another loopback address on the proxy's port: nothing listens there"},
			{proxy, "ok", "its own proxy"},
		} {
			out, stderr, _ := r.Thermite("trial", "agent", info.ID, "--", r.Bin, "__probe", "try", "tcp", c.target)
			if got := strings.TrimSpace(out); got != c.want {
				t.Errorf("agent-1 connects to %s (%s): %q %s, want %s", c.target, c.why, got, stderr, c.want)
			}
		}
		if got, _, _ := r.Thermite("trial", "agent", info.ID, "--", r.Bin, "__probe", "try", "udp"); strings.TrimSpace(got) != "EPERM" {
			t.Errorf("agent-1 makes a UDP socket: %q, want EPERM", got)
		}
	})

	t.Run("a lane's own commands stay without TCP", func(t *testing.T) {
		out, stderr, _ := r.Thermite("trial", "exec", info.ID, "--", r.Bin, "__probe", "try", "tcp", proxy)
		if !strings.Contains(out, "EPERM") {
			t.Errorf("lane-1's trial exec connects to the proxy's address: %q %s, want EPERM", out, stderr)
		}
	})

	t.Run("the lane harness reaches the provider through the lane's proxy", func(t *testing.T) {
		out, stderr, code := r.Thermite(append([]string{"trial", "agent", info.ID, "--harness", "lane", "--"}, curlArgv(provider, "https://127.0.0.1:"+port+"/")...)...)
		if code != 0 || out != "provider says hi" {
			t.Fatalf("lane harness curl: exit %d %q %s", code, out, stderr)
		}
		ev := egressEvents(t, r, "egress", "127.0.0.1:"+port, 2)
		if len(ev) < 2 || ev[1].Trial != info.ID || ev[1].Data.Via != "lane-1" {
			t.Fatalf("egress events %+v, want a second one of trial %s via lane-1", ev, info.ID)
		}
		out, _, _ = r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--", r.Bin, "__probe", "try", "tcp", "127.0.0.1:"+port)
		if strings.TrimSpace(out) != "EACCES" {
			t.Errorf("lane harness connects to the provider directly: %q, want EACCES", out)
		}
	})

	t.Run("a restarted controller serves the same proxy", func(t *testing.T) {
		// The broker holds the listeners and hands them to every
		// controller it starts. (Last: a restarted controller refuses the
		// lane harness, having only the token's hash.)
		before := r.Status()
		if err := syscallKill(before.ControllerPID); err != nil {
			t.Fatal(err)
		}
		waitNewController(t, r, before.ControllerPID)
		out, stderr, code := r.Thermite(append([]string{"trial", "agent", info.ID, "--"}, curlArgv(provider, "https://127.0.0.1:"+port+"/")...)...)
		if code != 0 || out != "provider says hi" {
			t.Fatalf("curl through the proxy after a controller crash: exit %d %q %s", code, out, stderr)
		}
	})
}

// TestAgentUsesAnotherAgentsProxyRefused: agent-2, in its own namespace,
// reaches only its own proxy at the same address; given agent-1's token
// there it is refused (407), and what it tunnels is recorded for its own
// trial, never agent-1's.
func TestAgentUsesAnotherAgentsProxyRefused(t *testing.T) {
	r, provider, port, _, _ := egressRig(t)
	p := makeProject(t, r)
	info1, a1 := startTrial(t, r, 1, p)
	// Before lane 2 has a trial, agent-2's proxy speaks for none; and it
	// takes CONNECT alone.
	for _, c := range []struct{ request, want string }{
		{"CONNECT 127.0.0.1:" + port + " HTTP/1.1", " 403 "},
		{"GET / HTTP/1.1", " 405 "},
	} {
		script := fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/3128 || exit 1; printf '%s
Host: x

' >&3; head -n1 <&3`, c.request)
		out, stderr, _ := r.RunAs("agent-2", nil, "bash", "-c", script)
		if !strings.Contains(out, c.want) {
			t.Errorf("agent-2, no trial open, %q on its proxy: %q %s, want%s", c.request, out, stderr, c.want)
		}
	}
	info2, _ := startTrial(t, r, 2, p)
	basic := base64.StdEncoding.EncodeToString([]byte("trial:" + a1.token))
	// A CONNECT by hand with agent-1's token, over agent-2's proxy.
	script := fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/3128 2>/dev/null || { echo noconnect; exit 1; }; printf 'CONNECT 127.0.0.1:%s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nProxy-Authorization: Basic %s\r\n\r\n' >&3; head -n1 <&3`, port, port, basic)
	out, stderr, _ := r.Thermite("trial", "agent", info2.ID, "--", "bash", "-c", script)
	if !strings.Contains(out, " 407 ") {
		t.Fatalf("agent-2 with agent-1's token on its proxy: %q %s, want 407", out, stderr)
	}
	out, stderr, code := r.Thermite(append([]string{"trial", "agent", info2.ID, "--"}, curlArgv(provider, "https://127.0.0.1:"+port+"/")...)...)
	if code != 0 || out != "provider says hi" {
		t.Fatalf("agent-2 through its proxy: exit %d %q %s", code, out, stderr)
	}
	ev := egressEvents(t, r, "egress", "127.0.0.1:"+port, 1)
	if len(ev) != 1 || ev[0].Trial != info2.ID || ev[0].Data.Via != "agent-2" {
		t.Fatalf("egress events %+v, want exactly one, of trial %s via agent-2 (not %s)", ev, info2.ID, info1.ID)
	}
}

// TestAgentEgressWithoutNamespaceCapsRefusesToStart: a broker that may not
// make network namespaces (a container without SYS_ADMIN and NET_ADMIN)
// refuses to start where agent.egress lists providers, in one line
// naming the key, rather than start agents on the host's network or
// without their proxy.
func TestAgentEgressWithoutNamespaceCapsRefusesToStart(t *testing.T) {
	r := testrig.New(t, testrig.Options{NoStart: true, Extra: "\n[agent]\negress = [\"203.0.113.7:443\"]\n"})
	cmd := exec.Command("setpriv", "--bounding-set=-sys_admin,-net_admin", "--", r.Bin, "--config", r.Config, "serve")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("serve without CAP_SYS_ADMIN: %v\n%s", err, out)
	}
	const want = "thermite: agent.egress: the broker lacks CAP_SYS_ADMIN and CAP_NET_ADMIN, which starting agents in network namespaces of their own takes (give the broker's container SYS_ADMIN and NET_ADMIN, or leave agent.egress empty: agents then get no egress)\n"
	if !strings.HasSuffix(string(out), want) {
		t.Fatalf("serve without CAP_SYS_ADMIN said:\n%s\nwant its last line %q", out, want)
	}
	if _, err := os.Stat(r.Cfg.BrokerSocket()); !os.IsNotExist(err) {
		t.Errorf("the refused broker left its socket: %v", err)
	}
}

// TestAgentEgressOnLandlockWithoutNetRulesStaysInItsNamespace: where
// Landlock has no TCP rules (ABI 3; landlock-net is covered), an agent in
// egress mode may connect to any port, and still reaches only its proxy:
// nothing else listens in its namespace and nothing beyond lo is routed.
func TestAgentEgressOnLandlockWithoutNetRulesStaysInItsNamespace(t *testing.T) {
	host := listenTCP(t)
	r := testrig.New(t, oldKernel(3, "[host]\naccept_lost = [\"landlock-scope\"]\n[agent]\negress = [\"203.0.113.7:443\"]\n"))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	res, code := selftestJSON(t, r)
	if code != 0 || !res.Holds {
		t.Fatalf("self-test on ABI 3 with egress: exit %d %s", code, res.Sentence)
	}
	for _, c := range []struct{ target, want string }{
		{"127.0.0.1:" + host, "ECONNREFUSED"},
		{"127.0.0.1:" + apiTCPPort(t, r), "ECONNREFUSED"},
		{"203.0.113.1:443", "ENETUNREACH"},
		{"127.0.0.1:3128", "ok"},
	} {
		if got := r.Probe("agent-1", "tcp", c.target); got != c.want {
			t.Errorf("agent-1 on ABI 3 connects to %s: %s, want %s", c.target, got, c.want)
		}
	}
}

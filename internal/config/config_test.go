package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rig.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsNeedNoFile(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if c.StateDir != "/var/lib/thermite" || c.Lanes != 16 || len(c.ClosedTmp) != 3 || c.StartupSelftest != "refuse" {
		t.Fatalf("unexpected defaults: %+v", c)
	}
}

func TestFileOverridesDefaults(t *testing.T) {
	c, err := Load(write(t, "lanes = 4\nrole_prefix = \"t-\"\n[limits]\nwall_timeout = \"90s\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Lanes != 4 || c.RolePrefix != "t-" || c.Limits.WallTimeout.Duration != 90*time.Second || c.UIDBase != 20000 {
		t.Fatalf("got %+v", c)
	}
}

func TestBadInputNamesTheKey(t *testing.T) {
	cases := map[string]string{
		"colour = \"red\"\n":                                         `unknown key "colour"`,
		"[limits]\nnproc = 3\n":                                      `unknown key "limits.nproc"`,
		"lanes = 0\n":                                                "lanes: 0 is out of range",
		"lanes = \"many\"\n":                                         "lanes",
		"uid_base = 5\n":                                             "uid_base: 5 is out of range",
		"state_dir = \"relative/dir\"\n":                             "state_dir:",
		"role_prefix = \"Bad Prefix\"\n":                             "role_prefix:",
		"judge_cpus = \"3-1\"\n":                                     "judge_cpus:",
		"closed_tmp = [\"/tmp\", \"/tmp\"]\n":                        "closed_tmp: \"/tmp\" is listed twice",
		"startup_selftest = \"maybe\"\n":                             "startup_selftest:",
		"[limits]\nwall_timeout = \"soon\"\n":                        "wall_timeout",
		"[limits]\nprocesses = 0\n":                                  "limits.processes",
		"[gpu]\nlayout = \"sideways\"\n":                             "gpu.layout",
		"[gpu]\nfence_min_abi = 4\n":                                 "gpu.fence_min_abi",
		"state_dir = \"/tmp/x\"\nclosed_tmp = [\"/tmp\"]\n":          "holds state_dir",
		"[api]\nmax_conns_per_peer = 0\n":                            "api.max_conns_per_peer",
		"[api]\nmax_conns = 8\nmax_conns_per_peer = 9\n":             "api.max_conns_per_peer: 9",
		"lanes = 64\n":                                               "api.max_conns: 8192 is less than api.max_conns_per_peer (64) for each of the API's 130 peers",
		"lanes = 32\n[agent]\negress = [\"a.example:443\"]\n":        "api.max_conns: 8192 is less than api.max_conns_per_peer (64) for each of the API's 130 peers (32 lanes' and agents' sockets and egress proxies",
		"[api]\nidle_timeout = \"forever\"\n":                        "idle_timeout",
		"[api]\nheader_timeout = \"0s\"\n":                           "api.header_timeout",
		"[api]\nbody_timeout = \"-1s\"\n":                            "api.body_timeout",
		"[api]\nmax_inflight_bytes_per_token = 1024\n":               "api.max_inflight_bytes_per_token",
		"[api]\nmax_inflight_bytes = 1048576\n":                      "api.max_inflight_bytes:",
		"[api]\nmax_connections = 3\n":                               `unknown key "api.max_connections"`,
		"[api]\nmax_runs_per_lane = 0\n":                             "api.max_runs_per_lane: 0 must be at least 1",
		"[api]\naccept_rate = 0\n":                                   "api.accept_rate: 0 must be at least 1",
		"[api]\naccept_burst = -1\n":                                 "api.accept_burst: -1 must be at least 1",
		"[api]\nrequest_rate = 0\n":                                  "api.request_rate: 0 must be at least 1",
		"[api]\nrequest_burst = 0\n":                                 "api.request_burst: 0 must be at least 1",
		"[agent]\nwall_timeout = \"0s\"\n":                           "agent.wall_timeout",
		"[agent]\noutput_cap_mb = -1\n":                              "agent.output_cap_mb",
		"[agent]\negress = [\"api.example.com\"]\n":                  `agent.egress: "api.example.com" is not host:port`,
		"[agent]\negress = [\"a.example:443\", \"A.example:443\"]\n": "agent.egress: \"A.example:443\" is listed twice",
		"[agent]\negress = [\"a.example:99999\"]\n":                  "agent.egress",
		"[agent]\negress_port = 0\n":                                 "agent.egress_port: 0 is not a TCP port",
		"[agent]\npi_extension = \"thermite.ts\"\n":                  "agent.pi_extension: \"thermite.ts\" is not an absolute path",
		"[host]\naccept_lost = [\"landlock-everything\"]\n":          `host.accept_lost: "landlock-everything" is not a protection`,
	}
	for text, want := range cases {
		p := write(t, text)
		_, err := Load(p)
		if err == nil {
			t.Errorf("%q: accepted", text)
			continue
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%q: error %q does not name %q and the file", text, err, want)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error is more than one line: %q", text, err)
		}
	}
}

func TestExplicitMissingFileIsAnError(t *testing.T) {
	if _, err := Load("/nonexistent/rig.toml"); err == nil {
		t.Fatal("a missing --config file was accepted")
	}
}

func TestEncodeRoundTrips(t *testing.T) {
	c := Default()
	c.Lanes = 3
	s, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Load(write(t, s))
	if err != nil {
		t.Fatalf("printed config does not load: %v\n%s", err, s)
	}
	if back.Lanes != 3 || back.Limits.WallTimeout != c.Limits.WallTimeout {
		t.Fatalf("round trip changed values: %+v", back)
	}
}

// Two cards' timed runs get disjoint judge CPUs; a layout with fewer judge
// CPUs than cards refuses the cards left without one, naming the layout.
func TestJudgeCPUsSplitPerCard(t *testing.T) {
	c := Default()
	c.JudgeCPUs, c.TimingUsers = "4-7", 2
	a, errA := c.JudgeCPUsOf(0)
	b, errB := c.JudgeCPUsOf(1)
	if errA != nil || errB != nil || a.String() != "4-5" || b.String() != "6-7" || a.Intersects(b) {
		t.Fatalf("card 0 %s %v, card 1 %s %v", a, errA, b, errB)
	}
	c.JudgeCPUs, c.TimingUsers = "3", 2
	if s, err := c.JudgeCPUsOf(0); err != nil || s.String() != "3" {
		t.Errorf("card 0: %s %v", s, err)
	}
	_, err := c.JudgeCPUsOf(1)
	if err == nil || !strings.Contains(err.Error(), "card 1 has no judge CPU of its own") || !strings.Contains(err.Error(), "timing_users = 2") {
		t.Errorf("card 1 of one judge CPU: %v", err)
	}
}

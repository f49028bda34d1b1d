package rig

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// BenchmarkSoak runs a rig as it runs all day: 16 lanes, each starting a
// trial, making a few commands and API calls in it, ending it, and again,
// for SOAK_TIME (default 2m). It prints, per quarter of the run, commands
// per second, p50/p99 of `trial exec` (the harness API's exec) and of an
// API call, the broker's and the controller's CPU and RSS, and the disk
// the trials hold; then how the last quarter compares with the first
// (aim: flat).
//
//	SOAK_TIME=5m go test ./e2e/rig -run '^$' -bench Soak -benchtime 1x -timeout 30m
func BenchmarkSoak(b *testing.B) {
	soak := 2 * time.Minute
	if v := os.Getenv("SOAK_TIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("SOAK_TIME: %v", err)
		}
		soak = d
	}
	const lanes = 16
	r := testrig.New(b, testrig.Options{Lanes: lanes, Extra: "[trial]\nretain_ended = \"10s\"\n"})
	project := filepath.Join(r.Dir, "project")
	os.MkdirAll(filepath.Join(project, "src"), 0o755)
	for i := 0; i < 200; i++ {
		os.WriteFile(filepath.Join(project, "src", fmt.Sprintf("f%03d.txt", i)), bytes.Repeat([]byte("x"), 4096), 0o644)
	}
	st := r.Status()
	quarter := soak / 4
	start := time.Now()
	type sample struct {
		at      time.Duration
		exec    time.Duration
		api     time.Duration
		command bool
	}
	var mu sync.Mutex
	var samples []sample
	var failures []string
	record := func(s sample) {
		mu.Lock()
		samples = append(samples, s)
		mu.Unlock()
	}
	fail := func(f string, a ...any) {
		mu.Lock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(f, a...))
		}
		mu.Unlock()
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for lane := 1; lane <= lanes; lane++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < soak {
				out, stderr, code := r.Thermite("trial", "start", "--lane", strconv.Itoa(lane), "--project", project, "--json")
				if code != 0 {
					fail("trial start lane %d: %s", lane, stderr)
					time.Sleep(time.Second)
					continue
				}
				var info controller.TrialInfo
				if err := json.Unmarshal([]byte(out), &info); err != nil {
					fail("trial start lane %d: %v", lane, err)
					continue
				}
				tok, _ := os.ReadFile(info.TokenFile)
				c := soakClient(r.Cfg.APISocket(), strings.TrimSpace(string(tok)))
				for k := 0; k < 3; k++ {
					t0 := time.Now()
					if err := c.call("POST", "/v1/exec", `{"argv":["sh","-c","ls src | wc -l"]}`); err != nil {
						fail("exec lane %d: %v", lane, err)
					}
					t1 := time.Now()
					if err := c.call("GET", "/v1/trial", ""); err != nil {
						fail("api lane %d: %v", lane, err)
					}
					record(sample{at: t0.Sub(start), exec: t1.Sub(t0), api: time.Since(t1), command: true})
				}
				// The calls come from this process, one peer for the API's
				// per-peer budget: its connections go with the trial.
				c.c.CloseIdleConnections()
				if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
					fail("trial end lane %d: %s", lane, stderr)
				}
			}
		}()
	}
	type usage struct {
		at             time.Duration
		brokerCPU, ctl time.Duration
		brokerRSS      int64
		ctlRSS         int64
		ctlAnon        int64 // the controller's anonymous RSS (the Go heap and stacks)
		ctlFile        int64 // its file-backed RSS (bbolt's mapping of ledger.db, the binary)
		ledger         int64 // ledger.db's size
		disk           int64
	}
	var usages []usage
	done := make(chan struct{})
	go func() {
		defer close(done)
		for time.Since(start) < soak {
			time.Sleep(quarter / 8)
			ctl := r.Status().ControllerPID
			bc, br := procUsage(st.BrokerPID)
			cc, cr := procUsage(ctl)
			anon, file := rssKinds(ctl)
			var ledger int64
			if fi, err := os.Stat(filepath.Join(r.Cfg.ControllerDir(), "ledger.db")); err == nil {
				ledger = fi.Size()
			}
			usages = append(usages, usage{at: time.Since(start), brokerCPU: bc, ctl: cc, brokerRSS: br, ctlRSS: cr, ctlAnon: anon, ctlFile: file, ledger: ledger, disk: duBytes(filepath.Join(r.Cfg.ScratchDir(), "trials"))})
		}
	}()
	wg.Wait()
	<-done
	b.StopTimer()
	for _, f := range failures {
		b.Error(f)
	}
	fmt.Printf("soak: %d lanes for %s\n", lanes, soak)
	fmt.Printf("%-8s %9s %10s %10s %10s %10s %11s %11s %10s %10s %9s\n", "quarter", "cmds/s", "exec p50", "exec p99", "api p50", "api p99", "broker cpu", "ctl cpu", "broker MB", "ctl MB", "disk MB")
	type row struct{ rate, e50, e99, a50, a99 float64 }
	var rows []row
	for q := 0; q < 4; q++ {
		lo, hi := time.Duration(q)*quarter, time.Duration(q+1)*quarter
		var ex, ap []time.Duration
		for _, s := range samples {
			if s.at >= lo && s.at < hi {
				ex, ap = append(ex, s.exec), append(ap, s.api)
			}
		}
		var u0, u1 *usage
		for i := range usages {
			if usages[i].at >= lo && usages[i].at < hi+quarter/8 {
				if u0 == nil {
					u0 = &usages[i]
				}
				u1 = &usages[i]
			}
		}
		var bcpu, ccpu time.Duration
		var brss, crss, disk int64
		if u0 != nil && u1 != nil {
			bcpu, ccpu, brss, crss, disk = u1.brokerCPU-u0.brokerCPU, u1.ctl-u0.ctl, u1.brokerRSS, u1.ctlRSS, u1.disk
		}
		rw := row{rate: float64(len(ex)) / quarter.Seconds(), e50: pct(ex, 50), e99: pct(ex, 99), a50: pct(ap, 50), a99: pct(ap, 99)}
		rows = append(rows, rw)
		fmt.Printf("%-8d %9.1f %8.1fms %8.1fms %8.2fms %8.2fms %10.2fs %10.2fs %10d %10d %9d\n", q+1, rw.rate, rw.e50, rw.e99, rw.a50, rw.a99, bcpu.Seconds(), ccpu.Seconds(), brss>>20, crss>>20, disk>>20)
	}
	// Where the controller's RSS goes: anonymous memory is the Go heap
	// (and stacks), file-backed is bbolt's mapping of a growing ledger.
	if n := len(usages); n > 1 {
		u0, u1 := usages[0], usages[n-1]
		fmt.Printf("controller RSS first -> last sample: anon %.1f -> %.1f MB, file-backed %.1f -> %.1f MB; ledger.db %.1f -> %.1f MB\n",
			mb(u0.ctlAnon), mb(u1.ctlAnon), mb(u0.ctlFile), mb(u1.ctlFile), mb(u0.ledger), mb(u1.ledger))
		for i := range usages {
			if i%8 == 7 || i == n-1 {
				fmt.Printf("  at %5.0fs: controller anon %.1f MB, file-backed %.1f MB, ledger.db %.1f MB\n", usages[i].at.Seconds(), mb(usages[i].ctlAnon), mb(usages[i].ctlFile), mb(usages[i].ledger))
			}
		}
	}
	if rows[0].rate > 0 && rows[0].e50 > 0 && rows[0].a50 > 0 {
		fmt.Printf("last quarter / first: cmds/s %.2fx, exec p50 %.2fx, api p50 %.2fx\n", rows[3].rate/rows[0].rate, rows[3].e50/rows[0].e50, rows[3].a50/rows[0].a50)
		b.ReportMetric(rows[3].e50/rows[0].e50, "exec-p50-last/first")
		b.ReportMetric(rows[3].rate/rows[0].rate, "rate-last/first")
	}
}

type soakHTTP struct {
	c     *http.Client
	token string
}

func soakClient(socket, token string) *soakHTTP {
	return &soakHTTP{token: token, c: &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}}
}

func (s *soakHTTP) call(method, path, body string) error {
	req, _ := http.NewRequest(method, "http://thermite"+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(buf.String()))
	}
	return nil
}

// pct is the p-th percentile in milliseconds.
func pct(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[(len(s)-1)*p/100].Microseconds()) / 1000
}

// procUsage is a process's CPU time (user and system) and resident size.
func procUsage(pid int) (time.Duration, int64) {
	if pid <= 0 {
		return 0, 0
	}
	f, err := statFields(pid)
	if err != nil {
		return 0, 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stt, _ := strconv.ParseInt(f[12], 10, 64)
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	// Clock ticks are 100 a second on Linux.
	return time.Duration(ut+stt) * 10 * time.Millisecond, rss * int64(os.Getpagesize())
}

// rssKinds is a process's anonymous and file-backed resident memory.
func rssKinds(pid int) (anon, file int64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "RssAnon:":
			anon = n << 10
		case "RssFile:":
			file = n << 10
		}
	}
	return anon, file
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

// duBytes is what a folder holds, as root sees it.
func duBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

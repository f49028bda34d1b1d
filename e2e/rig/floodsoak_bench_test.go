package rig

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/controller"
	"thermite/controller/ledger"
	"thermite/internal/testrig"
)

// BenchmarkFloodSoak runs BenchmarkFlood's flood for SOAK_TIME (default
// 3m): 15 lanes flood every path (each agent's socket and each lane's
// own, and each agent's egress proxy) while lane 16's agent makes its
// ordinary calls without end, each leaving a mark (a step, a research
// note, an exec that writes a file, a file write), and the judge times a
// fixed build every JUDGE_EVERY (default 20s). Before the flood the judge
// times it 3 times on the idle rig. It prints the judge's timing idle and
// flooded (the median of the timed runs' own medians, and their mean CV)
// and their ratio; then checks that nothing was lost: every mark lane 16
// was answered 200 for is in `ledger export` or on disk, every timed run
// is in the export, and the events' sequence numbers have no gap. It
// fails on lost data and on any error lane 16 saw. FLOOD_LANES and
// FLOOD_PAUSE_MS as for BenchmarkFlood.
//
//	SOAK_TIME=10m go test ./e2e/rig -run '^$' -bench FloodSoak -benchtime 1x -timeout 60m
func BenchmarkFloodSoak(b *testing.B) {
	soak := envDuration(b, "SOAK_TIME", 3*time.Minute)
	every := envDuration(b, "JUDGE_EVERY", 20*time.Second)
	pause := time.Duration(envOr("FLOOD_PAUSE_MS", 0)) * time.Millisecond
	lanes := envOr("FLOOD_LANES", 16)
	listed := listedHost(b)
	// Every role command may run for the whole soak (the egress flooders
	// through run-as); a trial's recorded steps and notes may fill it.
	extra := fmt.Sprintf("\n[limits]\nwall_timeout = %q\n[agent]\negress = [%q]\n", (soak + 5*time.Minute).String(), listed)
	r, trials := floodRigWith(b, lanes, testrig.Options{Lanes: lanes, Extra: extra, APIExtra: "max_trial_recorded = 1073741824\n"})
	build := spinKit(b, r, 20000, 5)
	victim := trials[len(trials)-1]
	b.ResetTimer()
	var idle []ledger.TimedRun
	for range 3 {
		idle = append(idle, judgeTime(b, r, build.ID, "spin"))
	}
	floods := startFloods(b, r, trials, soak+time.Minute, floodPaths{pause: pause, laneSockets: true, listed: listed, confined: true})
	marks := startAs(b, r, "agent-"+strconv.Itoa(victim.Lane), "soak-ordinary", "ATTACK_SOCKET="+victim.APISocket, "ATTACK_TOKEN="+tokenOf(b, victim))
	marks.expect("marking", time.Minute)
	var flooded []ledger.TimedRun
	end := time.Now().Add(soak)
	for next := time.Now(); time.Now().Before(end); next = next.Add(every) {
		time.Sleep(time.Until(next))
		flooded = append(flooded, judgeTime(b, r, build.ID, "spin"))
	}
	marks.stdin.Close()
	line := marks.expect("soak-ordinary ", 2*time.Minute)
	b.StopTimer()
	for _, l := range floods.stop(b) {
		b.Logf("flood: %s", l)
	}
	im, icv := judgeStats(idle)
	fm, fcv := judgeStats(flooded)
	fmt.Printf("flood soak: %d lanes flooding every path for %s (pause %s), the judge every %s\n", lanes-1, soak, pause, every)
	fmt.Printf("the judge's timing: idle median %.2f ms, CV %.2f%% (%d timed runs); flooded median %.2f ms, CV %.2f%% (%d timed runs); flooded/idle median %.2fx, CV %.2fx\n",
		im, icv, len(idle), fm, fcv, len(flooded), fm/im, fcv/math.Max(icv, 0.01))
	fmt.Printf("lane 16: %s\n", line)
	b.ReportMetric(im, "judge-idle-median-ms")
	b.ReportMetric(fm, "judge-flooded-median-ms")
	b.ReportMetric(fm/im, "judge-median-flooded/idle")
	b.ReportMetric(icv, "judge-idle-cv%")
	b.ReportMetric(fcv, "judge-flooded-cv%")
	lost := nothingLost(b, r, victim, line, append(idle, flooded...))
	fmt.Printf("nothing lost: %s\n", lost)
	if n := field(b, line, "errors"); n != 0 {
		b.Errorf("lane 16 saw %d errors under the flood: %s", n, line)
	}
}

// envDuration is the duration in the environment variable name, or def.
func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	return d
}

// judgeStats is the median of timed runs' own medians, in ms, and the
// mean of their CVs, in percent.
func judgeStats(runs []ledger.TimedRun) (medianMS, cv float64) {
	var ms []float64
	for _, tr := range runs {
		ms = append(ms, float64(tr.MedianWallNS)/1e6)
		cv += tr.CVPercent
	}
	if len(ms) == 0 {
		return 0, 0
	}
	slices.Sort(ms)
	return ms[len(ms)/2], cv / float64(len(runs))
}

// exported is what the soak reads back of `ledger export`.
type exported struct {
	Events []struct {
		Seq   uint64          `json:"seq"`
		Kind  string          `json:"kind"`
		Trial string          `json:"trial"`
		Data  json.RawMessage `json:"data"`
	} `json:"events"`
	TimedRuns []struct {
		ID string `json:"id"`
	} `json:"timed_runs"`
}

// nothingLost checks, after the soak, that every mark lane 16's agent was
// answered 200 for is kept (its steps and notes in the export, the notes'
// files, the files its execs and its writes made), every timed run is in
// the export, and the events' sequence numbers run without a gap. It fails
// the benchmark on anything missing, and says what it checked.
func nothingLost(b *testing.B, r *testrig.Rig, victim controller.TrialInfo, line string, runs []ledger.TimedRun) string {
	out, stderr, code := r.Thermite("ledger", "export")
	if code != 0 {
		b.Fatalf("ledger export: %s", stderr)
	}
	var ex exported
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		b.Fatalf("ledger export: %v", err)
	}
	var missing []string
	miss := func(f string, a ...any) {
		if len(missing) < 20 {
			missing = append(missing, fmt.Sprintf(f, a...))
		}
	}
	gaps := 0
	steps, notes := map[string]bool{}, map[string]string{}
	for i, e := range ex.Events {
		if uint64(i+1) != e.Seq {
			gaps++
			if gaps == 1 {
				miss("event %d of the export has sequence number %d", i+1, e.Seq)
			}
		}
		var d struct{ Text, Title, Path string }
		json.Unmarshal(e.Data, &d)
		switch {
		case e.Trial == victim.ID && e.Kind == "step":
			steps[d.Text] = true
		case e.Trial == victim.ID && e.Kind == "research.note":
			notes[d.Title] = d.Path
		}
	}
	n := field(b, line, "marks")
	failed := failedMarks(line)
	for i := range n {
		if failed["step:"+strconv.Itoa(i)] || failed["note:"+strconv.Itoa(i)] || failed["exec:"+strconv.Itoa(i)] || failed["write:"+strconv.Itoa(i)] {
			continue
		}
		if !steps[fmt.Sprint("soak-step-", i)] {
			miss("step %d is not in the export", i)
		}
		if p, ok := notes[fmt.Sprint("soak-note-", i)]; !ok {
			miss("note %d is not in the export", i)
		} else if _, err := os.Stat(p); err != nil {
			miss("note %d: %v", i, err)
		}
		for _, f := range []string{fmt.Sprint("soak-exec-", i, ".txt"), fmt.Sprint("soak-write-", i, ".txt")} {
			if data, err := os.ReadFile(filepath.Join(victim.Workspace, f)); err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(i) {
				miss("%s: %q %v", f, data, err)
			}
		}
	}
	kept := map[string]bool{}
	for _, tr := range ex.TimedRuns {
		kept[tr.ID] = true
	}
	for _, tr := range runs {
		if !kept[tr.ID] {
			miss("timed run %s is not in the export", tr.ID)
		}
	}
	if len(missing) > 0 {
		b.Fatalf("lost under the flood (%d event gaps):\n%s", gaps, strings.Join(missing, "\n"))
	}
	return fmt.Sprintf("%d marks of lane 16 (%d steps and %d notes in the export, their files and the notes' on disk), %d timed runs, %d events with no gap in their sequence numbers",
		n-len(failed), len(steps), len(notes), len(runs), len(ex.Events))
}

// failedMarks are the marks the soak's helper was not answered 200 for,
// as "kind:i", from its line's "failed" list.
func failedMarks(line string) map[string]bool {
	out := map[string]bool{}
	if _, list, ok := strings.Cut(line, " failed "); ok {
		for _, m := range strings.Split(strings.Fields(list)[0], ",") {
			if m != "-" {
				out[m] = true
			}
		}
	}
	return out
}

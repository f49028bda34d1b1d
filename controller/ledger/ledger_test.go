package ledger

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func openTemp(t testing.TB) (*Ledger, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

// at is a fixed, non-UTC time: stored times come back in UTC, equal to it.
var at = time.Date(2026, 3, 4, 5, 6, 7, 890, time.FixedZone("X", 3600))

func mustRun(t *testing.T, l *Ledger, id string) {
	t.Helper()
	if err := l.PutRun(Run{ID: id, Title: "run " + id, Created: at}); err != nil {
		t.Fatal(err)
	}
}

func trial(id, run string, lane int, token string) Trial {
	return Trial{
		ID: id, Run: run, Lane: lane,
		Workspace:   "/var/lib/thermite/scratch/trials/" + id + "/workspace",
		AgentDir:    "/var/lib/thermite/scratch/trials/" + id + "/agent",
		ResearchDir: "/var/lib/thermite/research/" + run + "/lanes/lane-" + strconv.Itoa(lane),
		TokenHash:   HashToken(token),
		Started:     at,
	}
}

func TestRoundTrips(t *testing.T) {
	l, _ := openTemp(t)

	r := Run{ID: "r1", Title: "speed up the parser", Project: "parser", Created: at}
	if err := l.PutRun(r); err != nil {
		t.Fatal(err)
	}
	got, ok, err := l.Run("r1")
	if err != nil || !ok {
		t.Fatalf("Run: %v %v", ok, err)
	}
	if !got.Created.Equal(at) || got.Created.Location() != time.UTC {
		t.Errorf("run created %v, want %v in UTC", got.Created, at)
	}
	got.Created = r.Created
	if got != r {
		t.Errorf("run = %+v, want %+v", got, r)
	}
	if _, ok, err := l.Run("nope"); ok || err != nil {
		t.Errorf("Run(nope) = %v, %v", ok, err)
	}
	if runs, err := l.Runs(); err != nil || len(runs) != 1 || runs[0].ID != "r1" {
		t.Errorf("Runs = %+v, %v", runs, err)
	}

	tr := trial("t1", "r1", 3, "tok-1")
	if err := l.StartTrial(tr); err != nil {
		t.Fatal(err)
	}
	gt, ok, err := l.Trial("t1")
	if err != nil || !ok {
		t.Fatalf("Trial: %v %v", ok, err)
	}
	want := tr
	want.State = TrialOpen
	want.Started = at.UTC()
	if !reflect.DeepEqual(gt, want) {
		t.Errorf("trial = %+v\nwant    %+v", gt, want)
	}
	end := at.Add(time.Hour)
	if err := l.EndTrial("t1", "budget spent", end); err != nil {
		t.Fatal(err)
	}
	gt, _, _ = l.Trial("t1")
	if gt.State != TrialEnded || gt.EndReason != "budget spent" || !gt.Ended.Equal(end) {
		t.Errorf("ended trial = %+v", gt)
	}
	if ts, err := l.Trials(); err != nil || len(ts) != 1 {
		t.Errorf("Trials = %+v, %v", ts, err)
	}

	var seqs []uint64
	for i := range 5 {
		seq, err := l.AddEvent(Event{At: at, Kind: "trial.note", Trial: "t1", Run: "r1", Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("sequence not increasing: %v", seqs)
		}
	}
	evs, err := l.Events(0, 0)
	if err != nil || len(evs) != 5 {
		t.Fatalf("Events(0,0) = %d, %v", len(evs), err)
	}
	if e := evs[2]; e.Seq != seqs[2] || e.Kind != "trial.note" || e.Trial != "t1" || e.Run != "r1" || string(e.Data) != `{"i":2}` || !e.At.Equal(at) {
		t.Errorf("event = %+v", e)
	}
	page, err := l.Events(seqs[1], 2)
	if err != nil || len(page) != 2 || page[0].Seq != seqs[2] || page[1].Seq != seqs[3] {
		t.Errorf("Events(after %d, 2) = %+v, %v", seqs[1], page, err)
	}
	if tail, _ := l.Events(seqs[4], 10); len(tail) != 0 {
		t.Errorf("Events after the last = %+v", tail)
	}
	if none, _ := l.Events(^uint64(0), 0); len(none) != 0 {
		t.Errorf("Events after max = %+v", none)
	}

	if err := l.AddSelftest(json.RawMessage(`{"holds":true,"roles":41}`), at); err != nil {
		t.Fatal(err)
	}
	if err := l.AddSelftest(json.RawMessage(`{"holds":false}`), at.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	sts, err := l.Selftests()
	if err != nil || len(sts) != 2 || string(sts[0].Result) != `{"holds":true,"roles":41}` || sts[1].Seq <= sts[0].Seq || !sts[1].At.Equal(at.Add(time.Minute)) {
		t.Errorf("Selftests = %+v, %v", sts, err)
	}

	b := Build{
		ID: "b1", Kit: "kit-a", Project: "parser", Created: at, Status: "ok", ExitCode: 0,
		Log: "cc -O2 ...\n", StorePath: "/var/lib/thermite/store/5f2a9c",
		Manifest: map[string]string{"bin/parse": HashToken("x"), "lib/a.so": HashToken("y")},
	}
	if err := l.PutBuild(b); err != nil {
		t.Fatal(err)
	}
	gb, ok, err := l.Build("b1")
	if err != nil || !ok {
		t.Fatalf("Build: %v %v", ok, err)
	}
	gb.Created = b.Created
	if !reflect.DeepEqual(gb, b) {
		t.Errorf("build = %+v\nwant    %+v", gb, b)
	}
	if bs, err := l.Builds(); err != nil || len(bs) != 1 {
		t.Errorf("Builds = %+v, %v", bs, err)
	}

	score := 0.875
	tr2 := TimedRun{
		ID: "tr1", Build: "b1", Kit: "kit-a", Card: 1,
		Repeats: []Repeat{
			{WallNS: 1_200_000, UserNS: 1_000_000, SysNS: 100_000, MaxRSSKB: 5120, ExitCode: 0},
			{WallNS: 1_300_000, UserNS: 1_100_000, SysNS: 90_000, MaxRSSKB: 5124, ExitCode: 0},
		},
		MedianWallNS: 1_250_000, SpreadWallNS: 100_000, PublicScore: &score,
		CheckOutput: "3/3 public cases pass", Created: at, Status: "ok",
	}
	if err := l.PutTimedRun(tr2); err != nil {
		t.Fatal(err)
	}
	gtr, ok, err := l.TimedRun("tr1")
	if err != nil || !ok {
		t.Fatalf("TimedRun: %v %v", ok, err)
	}
	gtr.Created = tr2.Created
	if !reflect.DeepEqual(gtr, tr2) {
		t.Errorf("timed run = %+v\nwant        %+v", gtr, tr2)
	}
	if rs, err := l.TimedRuns(); err != nil || len(rs) != 1 {
		t.Errorf("TimedRuns = %+v, %v", rs, err)
	}

	if err := l.PutHidden("tr1", "case-7", json.RawMessage(`{"pass":false,"diff":"line 3"}`)); err != nil {
		t.Fatal(err)
	}
	if err := l.PutHidden("tr1", "case-8", json.RawMessage(`{"pass":true}`)); err != nil {
		t.Fatal(err)
	}
	h, err := l.Hidden("tr1")
	if err != nil || len(h) != 2 || string(h["case-7"]) != `{"pass":false,"diff":"line 3"}` || string(h["case-8"]) != `{"pass":true}` {
		t.Errorf("Hidden = %v, %v", h, err)
	}
	if h, err := l.Hidden("other"); err != nil || len(h) != 0 {
		t.Errorf("Hidden(other) = %v, %v", h, err)
	}

	// Everything survives a close and reopen.
	path := l.Path()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if evs, _ := l2.Events(0, 0); len(evs) != 5 {
		t.Errorf("after reopen: %d events", len(evs))
	}
	if seq, _ := l2.AddEvent(Event{Kind: "k"}); seq != seqs[4]+1 {
		t.Errorf("after reopen: next seq %d, want %d", seq, seqs[4]+1)
	}
	if h, _ := l2.Hidden("tr1"); len(h) != 2 {
		t.Errorf("after reopen: hidden %v", h)
	}
}

func TestRefusals(t *testing.T) {
	l, _ := openTemp(t)
	mustRun(t, l, "r1")
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"run without id", l.PutRun(Run{Title: "x"}), ErrInvalid},
		{"trial with the token in clear", l.StartTrial(Trial{ID: "t", Run: "r1", Lane: 1, TokenHash: "tok-in-clear"}), ErrInvalid},
		{"trial with an uppercase hash", l.StartTrial(Trial{ID: "t", Run: "r1", Lane: 1, TokenHash: strings.ToUpper(HashToken("a"))}), ErrInvalid},
		{"trial on lane 0", l.StartTrial(trial("t", "r1", 0, "a")), ErrInvalid},
		{"trial of an unknown run", l.StartTrial(trial("t", "nope", 1, "a")), ErrNotFound},
		{"end of an unknown trial", l.EndTrial("nope", "x", at), ErrNotFound},
		{"end without a reason", l.EndTrial("nope", "", at), ErrInvalid},
		{"event without a kind", func() error { _, err := l.AddEvent(Event{}); return err }(), ErrInvalid},
		{"event with broken data", func() error { _, err := l.AddEvent(Event{Kind: "k", Data: json.RawMessage(`{`)}); return err }(), ErrInvalid},
		{"self-test not JSON", l.AddSelftest(json.RawMessage(`nope`), at), ErrInvalid},
		{"manifest path escaping", l.PutBuild(Build{ID: "b", Manifest: map[string]string{"../x": HashToken("x")}}), ErrInvalid},
		{"manifest absolute path", l.PutBuild(Build{ID: "b", Manifest: map[string]string{"/etc/x": HashToken("x")}}), ErrInvalid},
		{"manifest bad hash", l.PutBuild(Build{ID: "b", Manifest: map[string]string{"x": "abc"}}), ErrInvalid},
		{"timed run of an unknown build", l.PutTimedRun(TimedRun{ID: "tr", Build: "nope"}), ErrNotFound},
		{"hidden result of an unknown run", l.PutHidden("nope", "c", json.RawMessage(`1`)), ErrNotFound},
		{"hidden result not JSON", l.PutHidden("nope", "c", json.RawMessage(`x`)), ErrInvalid},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.want)
		} else if !strings.Contains(c.err.Error(), l.Path()) {
			t.Errorf("%s: error does not name the ledger: %v", c.name, c.err)
		}
	}
	if ts, _ := l.Trials(); len(ts) != 0 {
		t.Errorf("refused trials were stored: %+v", ts)
	}
}

func TestOneOpenTrialPerLane(t *testing.T) {
	l, _ := openTemp(t)
	mustRun(t, l, "r1")
	if err := l.StartTrial(trial("t1", "r1", 2, "a")); err != nil {
		t.Fatal(err)
	}
	err := l.StartTrial(trial("t2", "r1", 2, "b"))
	if !errors.Is(err, ErrLaneBusy) || !strings.Contains(err.Error(), "lane 2") || !strings.Contains(err.Error(), "t1") {
		t.Fatalf("second open trial on lane 2: %v", err)
	}
	if _, ok, _ := l.Trial("t2"); ok {
		t.Fatal("refused trial t2 was stored")
	}
	// Another lane is free.
	if err := l.StartTrial(trial("t3", "r1", 3, "c")); err != nil {
		t.Fatal(err)
	}
	if o, ok, err := l.OpenTrialOnLane(2); err != nil || !ok || o.ID != "t1" {
		t.Fatalf("OpenTrialOnLane(2) = %+v %v %v", o, ok, err)
	}
	// A trial id is never reused, even on a free lane.
	if err := l.StartTrial(trial("t1", "r1", 4, "d")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("reused trial id: %v", err)
	}
	if err := l.EndTrial("t1", "done", at); err != nil {
		t.Fatal(err)
	}
	if err := l.EndTrial("t1", "again", at); !errors.Is(err, ErrTrialEnded) {
		t.Fatalf("second EndTrial: %v", err)
	}
	if _, ok, _ := l.OpenTrialOnLane(2); ok {
		t.Fatal("lane 2 still has an open trial after EndTrial")
	}
	if err := l.StartTrial(trial("t2", "r1", 2, "b")); err != nil {
		t.Fatalf("lane 2 after EndTrial: %v", err)
	}
	if o, ok, _ := l.OpenTrialOnLane(2); !ok || o.ID != "t2" {
		t.Fatalf("OpenTrialOnLane(2) = %+v %v", o, ok)
	}
}

// Concurrent starts on one lane: exactly one wins.
func TestStartTrialRace(t *testing.T) {
	l, _ := openTemp(t)
	mustRun(t, l, "r1")
	const n = 16
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- l.StartTrial(trial("t"+strconv.Itoa(i), "r1", 5, "tok"+strconv.Itoa(i))) }()
	}
	won := 0
	for range n {
		err := <-errs
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrLaneBusy):
			t.Errorf("unexpected error: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d starts won lane 5, want 1", won)
	}
}

func TestTrialByToken(t *testing.T) {
	l, _ := openTemp(t)
	mustRun(t, l, "r1")
	for lane := 1; lane <= 4; lane++ {
		if err := l.StartTrial(trial("t"+strconv.Itoa(lane), "r1", lane, "secret-token-"+strconv.Itoa(lane))); err != nil {
			t.Fatal(err)
		}
	}
	got, ok, err := l.TrialByToken("secret-token-3")
	if err != nil || !ok || got.ID != "t3" || got.Lane != 3 {
		t.Fatalf("TrialByToken(open) = %+v %v %v", got, ok, err)
	}
	for _, bad := range []string{"", "secret-token-9", "secret-token-", HashToken("secret-token-3")} {
		if got, ok, err := l.TrialByToken(bad); ok || err != nil {
			t.Errorf("TrialByToken(%q) = %+v %v %v", bad, got, ok, err)
		}
	}
	if err := l.EndTrial("t3", "trial over", at); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := l.TrialByToken("secret-token-3"); ok || err != nil {
		t.Fatalf("ended trial's token found %+v (%v)", got, err)
	}
	if got, ok, _ := l.TrialByToken("secret-token-4"); !ok || got.ID != "t4" {
		t.Fatalf("other lanes' tokens must still work: %+v %v", got, ok)
	}
}

// The token never reaches the file: scan its raw bytes.
func TestTokenNeverInClear(t *testing.T) {
	l, path := openTemp(t)
	mustRun(t, l, "r1")
	const token = "tok_NEVER_IN_CLEAR_7c1e0d9b5a"
	if err := l.StartTrial(trial("t1", "r1", 1, token)); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := l.TrialByToken(token); !ok {
		t.Fatal("token not found")
	}
	if err := l.EndTrial("t1", "done", at); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := l.Export(&buf); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(HashToken(token))) {
		t.Fatal("the token's hash is not in the file: the scan would prove nothing")
	}
	if bytes.Contains(raw, []byte(token)) {
		t.Fatal("the token is in the ledger file in clear")
	}
	if bytes.Contains(buf.Bytes(), []byte(token)) {
		t.Fatal("the token is in the export in clear")
	}
}

func TestFileModeOnCreate(t *testing.T) {
	_, path := openTemp(t)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode(); m != 0o600 {
		t.Fatalf("ledger mode %v, want -rw-------", m)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
		t.Fatalf("ledger owned by uid %d, want the opener's %d", uid, os.Geteuid())
	}
}

func TestOpenRefusesLooseMode(t *testing.T) {
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620, 0o602} {
		path := filepath.Join(t.TempDir(), "ledger.db")
		l, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err = Open(path)
		want := fmt.Sprintf("%04o", mode)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open of a %04o ledger: %v (want the path and %s named)", mode, err, want)
		}
	}
	// An empty file made loose by someone else is refused too, before
	// bbolt writes anything into it.
	path := filepath.Join(t.TempDir(), "ledger.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "0644") {
		t.Errorf("Open of an empty 0644 file: %v", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Errorf("refused file was written to (%d bytes)", fi.Size())
	}
}

func TestOpenRefusesSymlinkAndDir(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real.db")
	l, err := Open(target)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	link := filepath.Join(dir, "ledger.db")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(link); err == nil || !strings.Contains(err.Error(), "symlink") || !strings.Contains(err.Error(), link) {
		t.Errorf("Open of a symlink: %v", err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("Open of a folder: %v", err)
	}
}

func TestSecondOpenerFailsClearly(t *testing.T) {
	old := openTimeout
	openTimeout = 300 * time.Millisecond
	defer func() { openTimeout = old }()
	_, path := openTemp(t)
	start := time.Now()
	l2, err := Open(path) // flock is per open file: this conflicts even in one process
	if err == nil {
		l2.Close()
		t.Fatal("second Open of a held ledger succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("second Open took %s", d)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "held open by another process") {
		t.Errorf("second Open: %v", err)
	}
}

func TestHiddenNeverExported(t *testing.T) {
	l, path := openTemp(t)
	mustRun(t, l, "r1")
	if err := l.StartTrial(trial("t1", "r1", 1, "tok")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AddEvent(Event{Kind: "judge.timed", Run: "r1", Data: json.RawMessage(`{"run":"tr1"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddSelftest(json.RawMessage(`{"holds":true}`), at); err != nil {
		t.Fatal(err)
	}
	if err := l.PutBuild(Build{ID: "b1", Kit: "k", Status: "ok"}); err != nil {
		t.Fatal(err)
	}
	if err := l.PutTimedRun(TimedRun{ID: "tr1", Build: "b1", Kit: "k", Status: "ok"}); err != nil {
		t.Fatal(err)
	}
	const canary = "HIDDEN_CANARY_3f9a1c"
	const caseCanary = "hidden-case-CANARY-77"
	if err := l.PutHidden("tr1", caseCanary, json.RawMessage(`{"expected":"`+canary+`"}`)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := l.Export(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.Bytes()
	if bytes.Contains(out, []byte(canary)) || bytes.Contains(out, []byte(caseCanary)) {
		t.Fatalf("hidden result leaked into the export:\n%s", out)
	}
	if !json.Valid(out) {
		t.Fatalf("export is not JSON:\n%s", out)
	}
	var obj map[string][]json.RawMessage
	if err := json.Unmarshal(out, &obj); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := []string{"builds", "events", "runs", "selftests", "timed_runs", "trials"}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("export keys %v, want %v", keys, want)
	}
	for k, n := range map[string]int{"runs": 1, "trials": 1, "events": 1, "selftests": 1, "builds": 1, "timed_runs": 1} {
		if len(obj[k]) != n {
			t.Errorf("export %s: %d records, want %d", k, len(obj[k]), n)
		}
	}
	var tr Trial
	if err := json.Unmarshal(obj["trials"][0], &tr); err != nil || tr.TokenHash != HashToken("tok") {
		t.Errorf("exported trial %+v (%v)", tr, err)
	}
	// The canary is really in the file: the export left it out, it was not
	// simply lost.
	if h, _ := l.Hidden("tr1"); !strings.Contains(string(h[caseCanary]), canary) {
		t.Fatalf("hidden result not stored: %v", h)
	}
	l.Close()
	if raw, _ := os.ReadFile(path); !bytes.Contains(raw, []byte(canary)) {
		t.Fatal("canary not in the file: the export check proves nothing")
	}
}

// The allow-list is the only way into Export, and the hidden bucket is in
// no table at all.
func TestHiddenBucketUnreachable(t *testing.T) {
	all := append([]table{tOpenLanes, tMeta}, exportTables...)
	for _, tb := range all {
		if bytes.Equal(tb.bucket, hiddenBucket) {
			t.Fatalf("table %q is the hidden bucket", tb.name)
		}
	}
	// An empty ledger exports every key with an empty list.
	l, _ := openTemp(t)
	var buf bytes.Buffer
	if err := l.Export(&buf); err != nil {
		t.Fatal(err)
	}
	var obj map[string][]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &obj); err != nil || len(obj) != len(exportTables) {
		t.Fatalf("empty export %s: %v", buf.Bytes(), err)
	}
	for k, v := range obj {
		if v == nil || len(v) != 0 {
			t.Errorf("empty export: %s = %v, want []", k, v)
		}
	}
}

// Crash safety. The child (this test binary again) writes in a tight loop,
// each transaction adding an event, bumping a counter and updating a trial;
// the parent SIGKILLs it at a random moment, reopens the file, runs bbolt's
// consistency check and checks that no transaction was torn.

const crashEnv = "THERMITE_LEDGER_CRASH_CHILD"

var crashCounter = []byte("crash_counter")

func crashWrite(l *Ledger) error {
	return l.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(crashCounter)
		if err != nil {
			return err
		}
		var n uint64
		if v := b.Get([]byte("n")); v != nil {
			n, _ = strconv.ParseUint(string(v), 10, 64)
		}
		n++
		if _, err := addEventTx(tx, Event{Kind: "crash.tick", Trial: "t-crash", Data: json.RawMessage(`{"n":` + strconv.FormatUint(n, 10) + `}`)}); err != nil {
			return err
		}
		var tr Trial
		if _, err := getJSON(tx, tTrials, "t-crash", &tr); err != nil {
			return err
		}
		tr.EndReason = strconv.FormatUint(n, 10) // any field: it must move with the counter
		if err := putJSON(tx, tTrials, []byte("t-crash"), tr); err != nil {
			return err
		}
		return b.Put([]byte("n"), []byte(strconv.FormatUint(n, 10)))
	})
}

func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("the crash test's child; runs only when TestCrashSafety starts it")
	}
	l, err := Open(path)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	for {
		if err := crashWrite(l); err != nil {
			fmt.Println("write:", err)
			os.Exit(3)
		}
	}
}

// crashCheck reopens the ledger and returns the counter after checking the
// file and the invariant.
func crashCheck(t *testing.T, path string) uint64 {
	t.Helper()
	l, err := Open(path)
	if err != nil {
		t.Fatalf("reopen after SIGKILL: %v", err)
	}
	defer l.Close()
	var n uint64
	err = l.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return fmt.Errorf("consistency check: %w", err)
		}
		if b := tx.Bucket(crashCounter); b != nil {
			n, _ = strconv.ParseUint(string(b.Get([]byte("n"))), 10, 64)
		}
		events := uint64(tx.Bucket(tEvents.bucket).Stats().KeyN)
		if events != n {
			return fmt.Errorf("torn transaction: counter %d, %d events", n, events)
		}
		if seq := tx.Bucket(tEvents.bucket).Sequence(); seq != n {
			return fmt.Errorf("torn transaction: counter %d, event sequence %d", n, seq)
		}
		var tr Trial
		if _, err := getJSON(tx, tTrials, "t-crash", &tr); err != nil {
			return err
		}
		if want := strconv.FormatUint(n, 10); n > 0 && tr.EndReason != want {
			return fmt.Errorf("torn transaction: counter %d, trial says %q", n, tr.EndReason)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := l.Events(0, 0); err != nil || uint64(len(evs)) != n {
		t.Fatalf("Events after SIGKILL: %d, %v (counter %d)", len(evs), err, n)
	}
	return n
}

func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: several child processes killed mid-write")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.PutRun(Run{ID: "r-crash"}); err != nil {
		t.Fatal(err)
	}
	if err := l.StartTrial(trial("t-crash", "r-crash", 1, "tok")); err != nil {
		t.Fatal(err)
	}
	l.Close()

	var prev uint64
	const rounds = 8
	for round := range rounds {
		cmd := exec.Command(exe, "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnv+"="+path)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || line != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: child said %q (%v)", round, line, err)
		}
		delay := 50*time.Millisecond + rand.N(250*time.Millisecond)
		time.Sleep(delay)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child did not die of SIGKILL (it failed on its own?): %v", round, err)
		}
		n := crashCheck(t, path)
		t.Logf("round %d: killed after %s; %d transactions committed in all (+%d)", round, delay.Round(time.Millisecond), n, n-prev)
		if n < prev {
			t.Fatalf("round %d: counter went back from %d to %d", round, prev, n)
		}
		prev = n
	}
	if prev == 0 {
		t.Fatal("the child never committed a transaction: the test proved nothing")
	}
}

// BenchmarkAddEvent: one bbolt transaction per event, so one fsync (two:
// data pages, then the meta page) per op; the figure is the disk's.
func BenchmarkAddEvent(b *testing.B) {
	l, _ := openTemp(b)
	data := json.RawMessage(`{"lane":3,"cmd":"go test ./...","exit":0}`)
	for b.Loop() {
		if _, err := l.AddEvent(Event{Kind: "lane.command", Trial: "t1", Run: "r1", Data: data}); err != nil {
			b.Fatal(err)
		}
	}
}

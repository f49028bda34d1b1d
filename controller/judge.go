package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"thermite/controller/kit"
	"thermite/controller/ledger"
	"thermite/internal/confined"
	"thermite/internal/copytree"
	"thermite/internal/hashtree"
	"thermite/internal/rpc"
)

// The judge: builds of a project under a kit, the store, timed runs and
// the kit's check. It runs as the controller; builds run as builder and
// timed runs as the card's timing user, through the broker.

// BuildRequest asks for a build of an imported project under a kit.
type BuildRequest struct {
	Kit     string `json:"kit"`
	Project string `json:"project"`
}

// TimeRequest asks for a timed run of a stored build. Card -1: no card.
type TimeRequest struct {
	Build string `json:"build"`
	Kit   string `json:"kit"`
	Card  int    `json:"card"`
}

// MaxLog bounds a build's recorded log.
const MaxLog = 256 << 10

func (c *Controller) kitDir(name string) string {
	return filepath.Join(c.cfg.ControllerDir(), "kits", name)
}

func (c *Controller) loadKit(name string) (*kit.Kit, error) {
	if !runName().MatchString(name) {
		return nil, fmt.Errorf("judge: kit %q is not a kit name", name)
	}
	dir := c.kitDir(name)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("judge: no kit %q imported (thermite kit import DIR)", name)
	}
	return kit.Load(dir)
}

// capture runs one of the judge's commands (a build, a timed repeat)
// through the broker with stdout and stderr into one buffer, capped.
func (c *Controller) capture(ctx context.Context, req *rpc.RunRequest, limit int) (*rpc.RunResult, []byte, []byte, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, nil, err
	}
	var stdout, stderr bytes.Buffer
	done := make(chan struct{}, 2)
	drainTo := func(b *bytes.Buffer, f *os.File) {
		io.Copy(b, io.LimitReader(f, int64(limit)))
		io.Copy(io.Discard, f)
		f.Close()
		done <- struct{}{}
	}
	go drainTo(&stdout, outR)
	go drainTo(&stderr, errR)
	// The judge's Runs have kept connections of their own (runJudge).
	res, err := c.broker.runAs(ctx, runJudge, req, []*os.File{c.devnull, outW, errW}, func() { outW.Close(); errW.Close() })
	outW.Close()
	errW.Close()
	// A leftover of the role may hold the pipes; the broker stops those
	// of every role but a lane after the command, so the reads end.
	<-done
	<-done
	return res, stdout.Bytes(), stderr.Bytes(), err
}

// Build copies the project into a folder owned by builder, runs the kit's
// build there as builder, and moves the outputs into the store under a
// random name, read-only, each file hashed. A failed build keeps nothing.
func (c *Controller) Build(ctx context.Context, req BuildRequest) (ledger.Build, error) {
	k, err := c.loadKit(req.Kit)
	if err != nil {
		return ledger.Build{}, err
	}
	if err := c.importedProject(req.Project); err != nil {
		return ledger.Build{}, err
	}
	b := ledger.Build{ID: randomID("b", 8), Kit: k.Name, Project: filepath.Base(req.Project), Created: time.Now().UTC(), Status: "building"}
	dir := filepath.Join(c.cfg.ScratchDir(), "builds", b.ID)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return b, fmt.Errorf("judge: %w", err)
	}
	os.Chmod(dir, 0o711)
	src := filepath.Join(dir, "src")
	defer func() {
		c.broker.handFolder(src, "thermite", 0o700, false)
		os.RemoveAll(dir)
	}()
	if _, err := copytree.Copy(req.Project, src, copytree.Options{UID: -1, GID: -1}); err != nil {
		return b, fmt.Errorf("judge: %w", err)
	}
	if err := c.broker.handFolder(src, "builder", 0o700, false); err != nil {
		return b, fmt.Errorf("judge: build folder: %w", err)
	}
	run := &rpc.RunRequest{Role: "builder", Argv: k.Build.Command, Cwd: src, Limits: k.Build.Limits.RPC()}
	guard := c.guardDisk("builder", "the build", "judge.build_disk_mb", c.cfg.Judge.BuildDiskMB)
	res, stdout, stderr, err := c.capture(ctx, run, MaxLog)
	b.Log = string(stdout) + string(stderr)
	if res != nil {
		b.ExitCode = res.ExitCode
	}
	// A build over its disk limit fails whatever its exit, with one line
	// naming the limit.
	if derr := guard.finish(); derr != nil {
		b.Status = "failed"
		b.Log += "\n" + derr.Error()
		c.ledger.PutBuild(b)
		c.event("judge.build", ledger.Trial{}, map[string]any{"build": b.ID, "kit": b.Kit, "status": b.Status, "exit_code": b.ExitCode, "error": derr.Error()})
		return b, derr
	}
	if err != nil || res == nil || res.ExitCode != 0 {
		b.Status = "failed"
		if err != nil {
			b.Log += "\n" + err.Error()
		}
		if res != nil && res.Stopped != rpc.StoppedExited {
			b.Log += fmt.Sprintf("\nstopped: %s", res.Stopped)
		}
		c.ledger.PutBuild(b)
		c.event("judge.build", ledger.Trial{}, map[string]any{"build": b.ID, "kit": b.Kit, "status": b.Status, "exit_code": b.ExitCode})
		return b, fmt.Errorf("judge: build %s failed (exit %d)", b.ID, b.ExitCode)
	}
	// The outputs come back to the controller, then into the store.
	if err := c.broker.handFolder(src, "thermite", 0o700, false); err != nil {
		return b, fmt.Errorf("judge: build folder: %w", err)
	}
	store := filepath.Join(c.cfg.StoreDir(), randomID("", 16))
	if err := c.storeOutputs(k, src, store); err != nil {
		discardStore(store)
		b.Status, b.Log = "failed", b.Log+"\n"+err.Error()
		c.ledger.PutBuild(b)
		return b, err
	}
	manifest, err := hashtree.Hash(store)
	if err != nil {
		discardStore(store)
		b.Status, b.Log = "failed", b.Log+"\n"+err.Error()
		c.ledger.PutBuild(b)
		return b, fmt.Errorf("judge: %w", err)
	}
	b.StorePath, b.Manifest, b.Status = store, manifest, "stored"
	if err := c.ledger.PutBuild(b); err != nil {
		discardStore(store)
		return b, err
	}
	c.event("judge.build", ledger.Trial{}, map[string]any{"build": b.ID, "kit": b.Kit, "status": b.Status, "files": len(manifest)})
	return b, nil
}

// storeOutputs copies the build's outputs into a new store folder: owned
// by the controller, files 0444 or 0555, folders 0555. The store itself is
// 0711, so a build can be reached only by its exact, random path.
func (c *Controller) storeOutputs(k *kit.Kit, src, store string) error {
	lim := &sizeLimit{what: "the build's outputs", key: "judge.build_disk_mb", limitMB: c.cfg.Judge.BuildDiskMB}
	if err := plainOutputs(src, k.Build.Outputs, lim); err != nil {
		return err
	}
	if err := os.Mkdir(store, 0o700); err != nil {
		return fmt.Errorf("judge: %w", err)
	}
	for _, o := range k.Build.Outputs {
		from := filepath.Join(src, o)
		st, err := os.Lstat(from)
		if err != nil {
			return fmt.Errorf("judge: build output %s: %w", o, err)
		}
		to := filepath.Join(store, o)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return fmt.Errorf("judge: %w", err)
		}
		switch {
		case st.IsDir():
			if _, err := copytree.Copy(from, to, copytree.Options{UID: -1, GID: -1, ReadOnly: true, RefuseLinks: true}); err != nil {
				return fmt.Errorf("judge: build output %s: %w", o, err)
			}
		case st.Mode().IsRegular():
			if err := copyFileRO(from, to, st.Mode()); err != nil {
				return fmt.Errorf("judge: build output %s: %w", o, err)
			}
		default:
			return fmt.Errorf("judge: build output %s is not a file or a folder", o)
		}
	}
	// Folders on the way to an output, then the build's own folder.
	filepath.Walk(store, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.IsDir() {
			os.Chmod(p, 0o555)
		}
		return nil
	})
	return nil
}

// plainOutputs decides what a build may store: each output, and all it
// holds, is a folder or a regular file with one link, inside the build,
// and together they are no larger than the build's disk limit, holes
// counted (lim).
// A symlink would let the next timed run execute whatever its target holds
// then, which no hash covers; a hard link, a device, a FIFO or a socket has
// no content of the build's own. Each is refused with its path. (Every
// builder process has been stopped and the folder is the controller's
// again, so nothing changes between this check and the copy; the store's
// hash refuses symlinks and links again.)
func plainOutputs(src string, outputs []string, lim *sizeLimit) error {
	for _, o := range outputs {
		// No part of an output's path may be a symlink: the controller
		// must not be led outside the build.
		if err := noSymlinks(src, o); err != nil {
			return fmt.Errorf("judge: build output %s: %w", o, err)
		}
		if err := plainTree(src, filepath.Join(src, o), "a build's outputs must be plain files and folders", lim); err != nil {
			return err
		}
	}
	return nil
}

// discardStore removes a store folder that was not recorded: its folders
// are read-only, so each is made writable first.
func discardStore(store string) {
	filepath.WalkDir(store, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	os.RemoveAll(store)
}

// noSymlinks refuses a relative path any part of which, beneath root, is a
// symlink.
func noSymlinks(root, rel string) error {
	p := root
	for _, part := range strings.Split(filepath.Clean(rel), "/") {
		p = filepath.Join(p, part)
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symlink", strings.TrimPrefix(p, root+"/"))
		}
	}
	return nil
}

func copyFileRO(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	perm := os.FileMode(0o444)
	if mode&0o100 != 0 {
		perm = 0o555
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// Holes stay holes: the apparent size was bounded (plainTree), the
	// blocks written are only those the file has.
	if err := copytree.Data(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(to, perm)
}

// timingRole is the timing user of a card: run for card 0 (and for runs
// without a card), run-(N+1) for card N.
func timingRole(card int) string {
	if card <= 0 {
		return "run"
	}
	return fmt.Sprintf("run-%d", card+1)
}

// Time checks a stored build against its hashes, makes a folder for this
// run with a read-only copy of the kit's run.copy files and an out/ of the
// timing user's own, runs the build as the timing user pinned to the judge
// CPUs as often as the kit says, then runs the kit's check as the
// controller. Hidden cases go to the ledger's hidden table only.
func (c *Controller) Time(ctx context.Context, req TimeRequest) (ledger.TimedRun, error) {
	k, b, tr, err := c.planTimedRun(req)
	if err != nil {
		return tr, err
	}
	// The run's folder, with a random name: made private, filled, then
	// opened to this run's timing user alone (openRunFolder). The command
	// sees it as its working folder and names what is in it by relative
	// paths (build, kit, out), so its argv, which every user can read in
	// /proc, shows neither the run nor the store.
	runDir := filepath.Join(c.cfg.ScratchDir(), "runs", tr.ID)
	if err := os.Mkdir(runDir, 0o700); err != nil {
		return tr, fmt.Errorf("judge: %w", err)
	}
	defer c.removeRunDir(runDir)
	if err := c.fillRunFolder(runDir, k, b, tr.Role); err != nil {
		return tr, err
	}
	var gpus []int
	if tr.Card >= 0 {
		gpus = []int{tr.Card}
	}
	run := &rpc.RunRequest{
		Role: tr.Role, Argv: k.Expand(k.Run.Command, "build", "kit", "out"), Cwd: runDir,
		Limits: k.Run.Limits.RPC(), CPUs: tr.CPUs, GPUs: gpus,
	}
	out := filepath.Join(runDir, "out")
	stdout, stderr, err := c.timedRepeats(ctx, &tr, k, run, out)
	if err != nil {
		return tr, err
	}
	tr.MedianWallNS, tr.SpreadWallNS, tr.CVPercent = wallStats(tr.Repeats)
	hidden, err := c.scoreTimedRun(ctx, &tr, k, out, stdout, stderr)
	if err != nil {
		return tr, err
	}
	// The hidden cases go to the ledger once the run's record is there (or
	// its writing has failed), as the last thing before the folder goes.
	defer func() {
		for name, v := range hidden {
			c.ledger.PutHidden(tr.ID, name, v)
		}
	}()
	if err := c.ledger.PutTimedRun(tr); err != nil {
		return tr, err
	}
	c.event("judge.time", ledger.Trial{}, map[string]any{"run": tr.ID, "build": b.ID, "status": tr.Status, "median_wall_ns": tr.MedianWallNS, "public_score": tr.PublicScore})
	if tr.Status != "scored" {
		return tr, fmt.Errorf("judge: timed run %s: %s: %s", tr.ID, tr.Status, tr.Error)
	}
	return tr, nil
}

// planTimedRun checks what a timed run asks for: the kit, a stored build
// whose files still match their hashes, the card and enough of its judge
// CPUs. It returns the run's record, not yet written.
func (c *Controller) planTimedRun(req TimeRequest) (*kit.Kit, ledger.Build, ledger.TimedRun, error) {
	k, err := c.loadKit(req.Kit)
	if err != nil {
		return nil, ledger.Build{}, ledger.TimedRun{}, err
	}
	b, ok, err := c.ledger.Build(req.Build)
	if err != nil {
		return nil, b, ledger.TimedRun{}, err
	}
	if !ok || b.Status != "stored" {
		return nil, b, ledger.TimedRun{}, fmt.Errorf("judge: no stored build %s", req.Build)
	}
	if err := hashtree.Verify(b.StorePath, b.Manifest); err != nil {
		c.event("judge.tampered", ledger.Trial{}, map[string]any{"build": b.ID, "error": err.Error()})
		return nil, b, ledger.TimedRun{}, fmt.Errorf("judge: build %s refused: %w", b.ID, err)
	}
	if k.Run.Cards > 0 && req.Card < 0 {
		req.Card = 0
	}
	if k.Run.Cards == 0 {
		req.Card = -1
	}
	// Each card's timed runs have judge CPUs of their own.
	judge, err := c.cfg.JudgeCPUsOf(req.Card)
	if err != nil {
		return nil, b, ledger.TimedRun{}, fmt.Errorf("judge: %w", err)
	}
	if k.Run.CPUs > len(judge) {
		return nil, b, ledger.TimedRun{}, fmt.Errorf("judge: kit %s wants %d CPUs; card %d has %d judge CPUs (%s of judge_cpus %s, split over timing_users = %d)", k.Name, k.Run.CPUs, max(req.Card, 0), len(judge), judge, c.cfg.JudgeCPUs, c.cfg.TimingUsers)
	}
	cpus := judge[:k.Run.CPUs]
	tr := ledger.TimedRun{ID: randomID("r", 8), Build: b.ID, Kit: k.Name, Card: req.Card, Created: time.Now().UTC(), Status: "running", Role: timingRole(req.Card), CPUs: cpus.String()}
	return k, b, tr, nil
}

// fillRunFolder puts in a timed run's folder what the command sees: the
// kit's run.copy files, the build (a link into the store) and out/, then
// opens the folder to the run's timing user alone.
func (c *Controller) fillRunFolder(runDir string, k *kit.Kit, b ledger.Build, role string) error {
	if err := c.copyKitFiles(k, filepath.Join(runDir, "kit")); err != nil {
		return err
	}
	if err := os.Symlink(b.StorePath, filepath.Join(runDir, "build")); err != nil {
		return fmt.Errorf("judge: %w", err)
	}
	return c.openRunFolder(runDir, role)
}

// timedRepeats runs the build as often as the kit says, each repeat
// recorded in tr, until one fails (tr says how). It returns the last good
// repeat's output, which the kit may keep; an error is one of the rig's.
func (c *Controller) timedRepeats(ctx context.Context, tr *ledger.TimedRun, k *kit.Kit, run *rpc.RunRequest, out string) (stdout, stderr []byte, err error) {
	for i := 0; i < k.Run.Repeats; i++ {
		// Every repeat starts from an empty out/ of the timing user's: no
		// repeat sees what an earlier one left.
		if err := c.freshOut(out, tr.Role, i > 0); err != nil {
			return nil, nil, err
		}
		guard := c.guardDisk(tr.Role, "the run", "judge.run_out_mb", c.cfg.Judge.RunOutMB)
		res, so, se, err := c.capture(ctx, run, MaxLog)
		if derr := guard.finish(); derr != nil {
			tr.Status, tr.Error = "failed", fmt.Sprintf("repeat %d: %v", i+1, derr)
			break
		}
		if err != nil || res == nil {
			tr.Status, tr.Error = "failed", fmt.Sprint(err)
			break
		}
		stdout, stderr = so, se
		if len(res.CardStops) > 0 {
			// Development runs that had the card open were stopped so the
			// timed run has it alone: on record, with the run.
			c.log.Warn("judge: processes stopped for a held card", "run", tr.ID, "card", tr.Card, "stopped", res.CardStops)
			c.event("judge.card_stopped", ledger.Trial{}, map[string]any{"run": tr.ID, "card": tr.Card, "repeat": i + 1, "stopped": res.CardStops})
		}
		tr.Repeats = append(tr.Repeats, ledger.Repeat{WallNS: res.WallNS, UserNS: res.UserNS, SysNS: res.SysNS, MaxRSSKB: res.MaxRSSKB, ExitCode: res.ExitCode, StartWaitNS: res.StartWaitNS, StartsAhead: res.StartsAhead})
		if res.ExitCode != 0 {
			tr.Status, tr.Error = "failed", fmt.Sprintf("repeat %d: exit %d (%s): %.300s", i+1, res.ExitCode, res.Stopped, strings.TrimSpace(string(se)))
			break
		}
	}
	return stdout, stderr, nil
}

// scoreTimedRun takes out/ back from the timing user and, when the run
// did not fail, keeps its output and runs the kit's check: tr says the
// score or why there is none. It returns the hidden cases' results.
func (c *Controller) scoreTimedRun(ctx context.Context, tr *ledger.TimedRun, k *kit.Kit, out string, stdout, stderr []byte) (map[string]json.RawMessage, error) {
	// out/ comes back to the controller, read-only, before the check reads
	// it; it must hold plain files and folders only, each with one link,
	// since the controller and the check read it by path.
	if err := c.broker.handFolder(out, "thermite", 0o700, true); err != nil {
		return nil, fmt.Errorf("judge: out/: %w", err)
	}
	if tr.Status != "failed" {
		lim := &sizeLimit{what: "the run's out/", key: "judge.run_out_mb", limitMB: c.cfg.Judge.RunOutMB}
		if err := PlainTree(out, lim); err != nil {
			tr.Status, tr.Error = "failed", err.Error()
		}
	}
	if tr.Status == "failed" {
		return nil, nil
	}
	if err := c.saveStream(out, k.Run.Stdout, stdout); err != nil {
		c.log.Warn("judge: save stdout", "run", tr.ID, "err", err)
	}
	if err := c.saveStream(out, k.Run.Stderr, stderr); err != nil {
		c.log.Warn("judge: save stderr", "run", tr.ID, "err", err)
	}
	public, hidden, err := c.check(ctx, k, out, tr.Repeats)
	if err != nil {
		tr.Status, tr.Error = "check failed", err.Error()
		return nil, nil
	}
	tr.Status = "scored"
	score := public.Score
	tr.PublicScore = &score
	raw, _ := json.Marshal(public)
	tr.CheckOutput = string(raw)
	return hidden, nil
}

// openRunFolder decides who reaches a timed run's folder: the controller,
// which owns it, and the run's timing user, through its own group, and no
// other role, even one that knows every path in it (the folder holds the
// kit's cases, hidden ones included, and a link naming the build's place
// in the store). Only the broker can set that group: owner the controller,
// group the timing user's own, mode 0750.
func (c *Controller) openRunFolder(dir, role string) error {
	if err := c.broker.runFolder(dir, role); err != nil {
		return fmt.Errorf("judge: run folder %s: %w", dir, err)
	}
	return nil
}

// copyKitFiles makes the run's read-only copy of the kit's run.copy files,
// owned by the controller: the run reads it and cannot change it.
func (c *Controller) copyKitFiles(k *kit.Kit, dst string) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("judge: %w", err)
	}
	for _, p := range k.Run.Copy {
		from := filepath.Join(k.Dir, p)
		to := filepath.Join(dst, p)
		st, err := os.Lstat(from)
		if err != nil {
			return fmt.Errorf("judge: run.copy %s: %w", p, err)
		}
		os.MkdirAll(filepath.Dir(to), 0o755)
		if st.IsDir() {
			if _, err := copytree.Copy(from, to, copytree.Options{UID: -1, GID: -1, ReadOnly: true}); err != nil {
				return fmt.Errorf("judge: run.copy %s: %w", p, err)
			}
			os.Chmod(to, 0o555)
		} else if err := copyFileRO(from, to, st.Mode()); err != nil {
			return fmt.Errorf("judge: run.copy %s: %w", p, err)
		}
	}
	filepath.Walk(dst, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.IsDir() {
			os.Chmod(p, 0o555)
		}
		return nil
	})
	return nil
}

// saveStream writes a captured stream where the kit wants it (a path under
// out/), by descriptor: the folder is opened beneath out/ without following
// a symlink, a name the run left there is removed, and the file is made
// with O_EXCL|O_NOFOLLOW.
func (c *Controller) saveStream(out, rel string, data []byte) error {
	if rel == "" {
		return nil
	}
	rel = strings.TrimPrefix(rel, "out/")
	dir, err := confined.Open(out, filepath.Dir(rel), unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return err
	}
	unix.Fchmod(dfd, 0o700)
	defer unix.Fchmod(dfd, st.Mode&0o7777)
	name := filepath.Base(rel)
	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: %w", rel, err)
	}
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	_, err = f.Write(data)
	return err
}

// freshOut makes out/ anew for the timing user: handed back and removed
// first when an earlier repeat used it.
func (c *Controller) freshOut(out, role string, again bool) error {
	if again {
		if err := c.broker.handFolder(out, "thermite", 0o700, false); err != nil {
			return fmt.Errorf("judge: out/: %w", err)
		}
		if err := os.RemoveAll(out); err != nil {
			return fmt.Errorf("judge: out/: %w", err)
		}
	}
	if err := os.Mkdir(out, 0o700); err != nil {
		return fmt.Errorf("judge: %w", err)
	}
	if err := c.broker.handFolder(out, role, 0o700, false); err != nil {
		return fmt.Errorf("judge: out/: %w", err)
	}
	return nil
}

// removeRunDir removes a run's folder once its results are recorded: what
// the run wrote is handed back first.
func (c *Controller) removeRunDir(dir string) {
	out := filepath.Join(dir, "out")
	if _, err := os.Lstat(out); err == nil {
		c.broker.handFolder(out, "thermite", 0o700, false)
	}
	os.RemoveAll(dir)
}

// PlainTree refuses a tree that holds anything but folders and regular
// files with one link, or more than lim of apparent size: outputs of an
// untrusted run that the controller and a kit's check will read by path.
func PlainTree(root string, lim *sizeLimit) error {
	return plainTree(filepath.Dir(root), root, "a timed run's outputs must be plain files", lim)
}

// sizeLimit bounds the apparent size (st_size, holes counted) of what
// untrusted code left for the judge. The disk guards count allocated
// blocks, so a sparse file (truncate -s 1T) passes them taking none; but
// the store's copy, its hash and a kit's check read it whole.
type sizeLimit struct {
	what    string // "the build's outputs"
	key     string // the configuration key of the limit
	limitMB int64
	total   int64
}

// add counts a file of st, named rel, and refuses it where the total
// passes the limit, naming the file, its sizes and the limit.
func (l *sizeLimit) add(rel string, st *unix.Stat_t) error {
	l.total += st.Size
	if l.total <= l.limitMB<<20 {
		return nil
	}
	return fmt.Errorf("judge: %s is %d bytes (%d allocated): %s come to %d bytes with holes counted, over %s = %d (%d bytes); a sparse file is read whole by the copy, the hash and the check",
		rel, st.Size, st.Blocks*512, l.what, l.total, l.key, l.limitMB, l.limitMB<<20)
}

// plainTree is the one check of what untrusted code left for the judge to
// read or store: beneath root, only folders and regular files with one
// link, together within lim's apparent size. A symlink, a hard link, a
// device, a FIFO or a socket is refused, named by its path relative to
// base, with why.
func plainTree(base, root, why string, lim *sizeLimit) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(base, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			return nil
		case unix.S_IFREG:
			if st.Nlink > 1 {
				return fmt.Errorf("judge: %s has %d links: %s", rel, st.Nlink, why)
			}
			return lim.add(rel, &st)
		}
		return fmt.Errorf("judge: %s is not a plain file or folder (%s): %s", rel, hashtree.Kind(st.Mode), why)
	})
}

// CheckOut is what the check is told out/ is: the run's out/, as the
// check's descriptor 3, which its children inherit. A path naming the run
// folder would show in the command line of every program the check starts
// (awk's, say), which every role can read in /proc.
const CheckOut = "/proc/self/fd/3"

// check runs the kit's check as the controller, in the kit's own folder,
// with THERMITE_OUT (and {out}) naming the run's out/ by descriptor
// (CheckOut), and splits its answer: the public part, and the hidden cases.
func (c *Controller) check(ctx context.Context, k *kit.Kit, out string, reps []ledger.Repeat) (kit.PublicResult, map[string]json.RawMessage, error) {
	dir, err := os.OpenFile(out, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return kit.PublicResult{}, nil, fmt.Errorf("check of kit %q: %w", k.Name, err)
	}
	defer dir.Close()
	argv := k.Expand(k.Check.Command, "", k.Dir, CheckOut)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = k.Dir
	cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + k.Dir}, k.CheckEnv(CheckOut)...)
	cmd.Env = append(cmd.Env, TimesEnv(reps)...)
	cmd.ExtraFiles = []*os.File{dir}
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		return kit.PublicResult{}, nil, fmt.Errorf("check of kit %q: %v", k.Name, err)
	}
	return kit.ParseCheck(so.Bytes(), k)
}

// TimesEnv is what the check is told of the clock, per repeat in order,
// nanoseconds separated by spaces: THERMITE_WALL_NS, the candidate's wall
// time from its execve to its exit, and THERMITE_CPU_NS, its own CPU time
// (user and system, without the sandbox's start).
func TimesEnv(reps []ledger.Repeat) []string {
	wall := make([]string, len(reps))
	cpu := make([]string, len(reps))
	for i, r := range reps {
		wall[i] = strconv.FormatInt(r.WallNS, 10)
		cpu[i] = strconv.FormatInt(r.UserNS+r.SysNS, 10)
	}
	return []string{"THERMITE_WALL_NS=" + strings.Join(wall, " "), "THERMITE_CPU_NS=" + strings.Join(cpu, " ")}
}

// wallStats is the median and spread (max - min) of the wall times, and
// their coefficient of variation in percent.
func wallStats(reps []ledger.Repeat) (median, spread int64, cv float64) {
	if len(reps) == 0 {
		return 0, 0, 0
	}
	w := make([]int64, len(reps))
	var sum float64
	for i, r := range reps {
		w[i] = r.WallNS
		sum += float64(r.WallNS)
	}
	sort.Slice(w, func(i, j int) bool { return w[i] < w[j] })
	if len(w)%2 == 1 {
		median = w[len(w)/2]
	} else {
		median = (w[len(w)/2-1] + w[len(w)/2]) / 2
	}
	mean := sum / float64(len(w))
	var sq float64
	for _, x := range w {
		sq += (float64(x) - mean) * (float64(x) - mean)
	}
	if mean > 0 && len(w) > 1 {
		cv = 100 * math.Sqrt(sq/float64(len(w)-1)) / mean
	}
	return median, w[len(w)-1] - w[0], cv
}

// Package kit reads a kit: a folder with a manifest, kit.toml, that tells
// the judge how to build a project, how to run a build, and how to check a
// run.
//
// # The manifest
//
//	name = "sum"                  # [a-z0-9][a-z0-9._-]{0,63}
//	description = "…"             # optional
//
//	[build]                       # run as the builder in a copy of the project
//	command = ["cc", "-O2", "-o", "sum", "sum.c"]
//	outputs = ["sum"]             # paths in the build folder to keep
//	[build.limits]                # optional, as [run.limits]
//	timeout = "5m"
//
//	[run]                         # run as the timing user in the run's folder
//	command = ["{build}/sum", "{kit}/input.txt"]
//	copy = ["input.txt", "cases/"] # kit files and folders the run may read
//	repeats = 5                   # 1..100
//	cpus = 1                      # judge CPUs, 1..1024 (default 1)
//	cards = 0                     # GPUs, 0..1 (default 0)
//	stdout = "out/stdout.txt"     # optional, under out/ (stderr alike)
//	[run.limits]                  # optional; 0 or absent: the rig's default
//	timeout = "30s"               # a Go duration, 0 or 1ms..168h
//	processes = 256               # 0..4194304
//	open_files = 1024             # 0..1048576
//	address_space_mb = 0          # 0..1073741824
//	file_size_mb = 512            # 0..1073741824
//	cpu_seconds = 0               # 0..604800
//
//	[check]                       # run as the controller in the kit's folder
//	command = ["sh", "check.sh"]
//	hidden = ["case3"]            # cases whose results only the ledger keeps
//	public = "score"              # the aggregate that may be shown (default)
//
// Required: name, build.command, build.outputs, run.command, run.repeats,
// check.command. An unknown key, a missing field, a value of the wrong type
// or out of range, a path leaving its folder, and a kit whose files do not
// match the manifest are refused by Load with one line naming the field (or
// the kit file) and the value.
//
// Paths (build.outputs, run.copy, run.stdout, run.stderr) are relative and
// clean: no "..", no "./", no "//", not "."; a trailing "/" is allowed
// (and dropped). No entry of a list may lie inside another. run.copy's
// entries must exist in the kit, as files or folders; a symlink anywhere in
// the kit must stay inside it (an absolute one never does), and one that a
// run.copy entry carries must point at something run.copy also copies.
// Devices, FIFOs and sockets have no place in a kit.
//
// Commands are argument lists, never run through a shell. In run.command,
// {build} is the stored build (each build output at its own path), {kit}
// the run's read-only copy of the run.copy entries, {out} the run's own
// out/ folder; an argument that starts with "{build}/" must name a build
// output or something inside one, and one that starts with "{kit}/" a
// run.copy entry or something inside one. check.command may use {kit}
// (the kit's folder, also its working folder) and {out}; build.command
// none. A check program given as a relative path with a slash
// ("./check.sh") must be an executable file of the kit.
//
// # The check's output
//
// The check runs with THERMITE_OUT naming the run's out/ folder and
// THERMITE_HIDDEN listing check.hidden, space-separated (CheckEnv). It
// reads the run's outputs (written by the run: a check must not follow a
// symlink there, nor open what is not a regular file) and prints one JSON
// object on stdout, and nothing else but white space:
//
//	{"score": 0.75, "cases": {"case1": {"ok": true}, "case3": {"ok": false}}}
//
// The member named by check.public ("score" unless the kit says otherwise)
// is required and is a number: the aggregate that may be shown. "cases" is
// optional and maps each case's name to any JSON value. No other member is
// allowed (an aggregate that must stay private is reported as a hidden
// case; the public aggregate should count the public cases only, or it
// shows what the hidden ones hide). Hidden case names are
// [A-Za-z0-9._-]{1,128} and match the reported names exactly. The check
// exits 0 when it could score the run, failed cases included; any other
// status means there is no score.
//
// ParseCheck splits the object: the cases that check.hidden names go only
// to the hidden map, which the judge writes to the ledger's hidden table;
// the aggregate and every other case form the PublicResult, whose JSON
// form is the check's own shape without the hidden cases. A hidden case
// the check did not report is not an error. Errors never quote the check's
// output, so that a hidden result cannot reach a log.
package kit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"
	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/rpc"
)

// File is the manifest's name in a kit's folder.
const File = "kit.toml"

// MaxManifest bounds the size of kit.toml.
const MaxManifest = 1 << 20

// The placeholders of run.command and check.command.
const (
	PlaceBuild = "{build}"
	PlaceKit   = "{kit}"
	PlaceOut   = "{out}"
)

// Kit is a loaded, checked kit.
type Kit struct {
	// Dir is the kit's folder, absolute.
	Dir         string
	Name        string
	Description string
	Build       Build
	Run         Run
	Check       Check
}

// Build is how the builder builds a project.
type Build struct {
	Command []string
	// Outputs are the paths in the build folder that are kept, clean and
	// relative, without a trailing "/".
	Outputs []string
	Limits  Limits
}

// Run is how a build is timed.
type Run struct {
	Command []string
	// Copy are the kit's files and folders copied read-only into the
	// run's kit/ folder, clean and relative, without a trailing "/".
	Copy    []string
	Repeats int
	CPUs    int
	Cards   int
	// Stdout and Stderr, when not "", are where the run's output goes,
	// relative to the run's folder and under out/.
	Stdout string
	Stderr string
	Limits Limits
}

// Check is how the controller scores a run.
type Check struct {
	Command []string
	// Hidden names the cases whose results stay in the ledger's hidden
	// table.
	Hidden []string
	// Public names the aggregate the check reports that may be shown.
	Public string
}

// Limits bound a build or a run; zero is the rig's default. The broker only
// ever lowers its defaults with them.
type Limits struct {
	Processes      int
	OpenFiles      int
	AddressSpaceMB int64
	FileSizeMB     int64
	CPUSeconds     int
	Timeout        time.Duration
}

// RPC is the broker's form of the limits.
func (l Limits) RPC() rpc.Limits {
	ms := l.Timeout.Milliseconds()
	if l.Timeout > 0 && time.Duration(ms)*time.Millisecond < l.Timeout {
		ms++ // never shorter than asked, and never 0 ("the default")
	}
	return rpc.Limits{
		Processes:      l.Processes,
		OpenFiles:      l.OpenFiles,
		AddressSpaceMB: l.AddressSpaceMB,
		FileSizeMB:     l.FileSizeMB,
		CPUSeconds:     l.CPUSeconds,
		TimeoutMS:      ms,
	}
}

// IsHidden says whether the case is one of check.hidden.
func (k *Kit) IsHidden(name string) bool {
	for _, h := range k.Check.Hidden {
		if h == name {
			return true
		}
	}
	return false
}

// CheckEnv is what the check's environment must hold besides PATH and
// HOME: THERMITE_OUT, the run's out/ folder, and THERMITE_HIDDEN, the
// hidden cases separated by spaces ("" for none; always set, so that a
// check can tell a judge that forgot it from a kit without hidden cases).
func (k *Kit) CheckEnv(out string) []string {
	return []string{
		"THERMITE_OUT=" + out,
		"THERMITE_HIDDEN=" + strings.Join(k.Check.Hidden, " "),
	}
}

// Expand replaces the placeholders in argv: {build} with build, {kit} with
// kitCopy and {out} with out. A replaced value is never expanded again.
func (k *Kit) Expand(argv []string, build, kitCopy, out string) []string {
	r := strings.NewReplacer(PlaceBuild, build, PlaceKit, kitCopy, PlaceOut, out)
	expanded := make([]string, len(argv))
	for i, a := range argv {
		expanded[i] = r.Replace(a)
	}
	return expanded
}

// limitKeys are the keys of build.limits and run.limits.
var limitKeys = []string{"timeout", "processes", "open_files", "address_space_mb", "file_size_mb", "cpu_seconds"}

// known is the manifest's keys, made on first use (every thermite process
// links this package; only a kit's import reads a manifest). Anything else
// is an unknown key.
var known = sync.OnceValue(func() map[string]bool {
	m := map[string]bool{
		"name": true, "description": true,
		"build": true, "build.command": true, "build.outputs": true,
		"run": true, "run.command": true, "run.copy": true, "run.repeats": true,
		"run.cpus": true, "run.cards": true, "run.stdout": true, "run.stderr": true,
		"check": true, "check.command": true, "check.hidden": true, "check.public": true,
	}
	for _, t := range []string{"build.limits", "run.limits"} {
		m[t] = true
		for _, k := range limitKeys {
			m[t+"."+k] = true
		}
	}
	return m
})

// Ranges.
const (
	MaxRepeats   = 100
	MaxCPUs      = 1024
	MaxCards     = 1
	MaxProcesses = 4194304
	MaxOpenFiles = 1048576
	MaxMB        = 1 << 30
	MaxCPUSecs   = 7 * 24 * 3600
	MaxTimeout   = 7 * 24 * time.Hour
)

var (
	nameRE   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })
	publicRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`) })
	caseRE   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`) })
	// placeRE finds what looks like a placeholder leading a path.
	placeRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\{[A-Za-z_]+\}/`) })
)

// Load reads dir/kit.toml and checks it, and the kit's files, against each
// other. The error is one line: "kit <dir>/kit.toml: <field>: <what>".
func Load(dir string) (*Kit, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("kit %s: %w", dir, err)
	}
	file := filepath.Join(abs, File)
	fail := func(err error) error { return fmt.Errorf("kit %s: %w", file, err) }
	rootfd, err := unix.Open(abs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kit %s: %w", abs, err)
	}
	defer unix.Close(rootfd)
	data, err := readManifest(rootfd)
	if err != nil {
		return nil, fail(err)
	}
	k, err := parse(data)
	if err != nil {
		return nil, fail(err)
	}
	k.Dir = abs
	if err := checkFiles(rootfd, k); err != nil {
		return nil, fail(err)
	}
	return k, nil
}

// Parse reads a manifest without looking at a kit's folder: everything
// Load checks but the files. name says what errors call it.
func Parse(data []byte, name string) (*Kit, error) {
	k, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("kit %s: %w", name, err)
	}
	return k, nil
}

// readManifest reads kit.toml: a regular file of the kit, not a symlink.
func readManifest(rootfd int) ([]byte, error) {
	fd, err := confined.OpenBeneath(rootfd, File, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0, confined.NoSymlinks)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, errors.New("is a symlink")
		}
		return nil, err
	}
	f := os.NewFile(uintptr(fd), File)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("is not a regular file")
	}
	if st.Size() > MaxManifest {
		return nil, fmt.Errorf("is larger than %d bytes", MaxManifest)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxManifest+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxManifest {
		return nil, fmt.Errorf("is larger than %d bytes", MaxManifest)
	}
	return b, nil
}

func parse(data []byte) (*Kit, error) {
	var raw map[string]any
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			// Not pe.LastKey: on a syntax error it is the last key
			// that parsed, not the one at fault.
			return nil, fmt.Errorf("line %d: %s", pe.Position.Line, strings.ReplaceAll(pe.Message, "\n", " "))
		}
		return nil, errors.New(strings.ReplaceAll(err.Error(), "\n", " "))
	}
	for _, key := range md.Keys() {
		if !known()[key.String()] {
			return nil, fmt.Errorf("unknown key %q", key.String())
		}
	}
	d := &decoder{}
	k := &Kit{}
	k.Name = d.str(raw, "", "name", true)
	if d.err == nil && !nameRE().MatchString(k.Name) {
		d.failf("name: %q is not a kit name ([a-z0-9][a-z0-9._-]{0,63})", k.Name)
	}
	k.Description = d.str(raw, "", "description", false)

	build := d.table(raw, "", "build", true)
	k.Build.Command = d.argv(build, "build", "command", true)
	k.Build.Outputs = d.paths(build, "build", "outputs", true, "the build folder")
	k.Build.Limits = d.limits(build, "build")

	run := d.table(raw, "", "run", true)
	k.Run.Command = d.argv(run, "run", "command", true)
	k.Run.Copy = d.paths(run, "run", "copy", false, "the kit")
	k.Run.Repeats = d.int(run, "run", "repeats", true, 0, 1, MaxRepeats)
	k.Run.CPUs = d.int(run, "run", "cpus", false, 1, 1, MaxCPUs)
	k.Run.Cards = d.int(run, "run", "cards", false, 0, 0, MaxCards)
	k.Run.Stdout = d.outPath(run, "run", "stdout")
	k.Run.Stderr = d.outPath(run, "run", "stderr")
	if d.err == nil && k.Run.Stdout != "" && k.Run.Stdout == k.Run.Stderr {
		d.failf("run.stderr: %q is run.stdout too", k.Run.Stderr)
	}
	k.Run.Limits = d.limits(run, "run")

	check := d.table(raw, "", "check", true)
	k.Check.Command = d.argv(check, "check", "command", true)
	k.Check.Hidden = d.strs(check, "check", "hidden", false)
	k.Check.Public = d.str(check, "check", "public", false)
	if d.err != nil {
		return nil, d.err
	}
	if k.Check.Public == "" {
		k.Check.Public = "score"
	}
	if err := checkNames(k); err != nil {
		return nil, err
	}
	if err := checkCommands(k); err != nil {
		return nil, err
	}
	return k, nil
}

func checkNames(k *Kit) error {
	if !publicRE().MatchString(k.Check.Public) || k.Check.Public == "cases" {
		return fmt.Errorf("check.public: %q is not an aggregate's name ([A-Za-z_][A-Za-z0-9_.-]{0,63}, not \"cases\")", k.Check.Public)
	}
	seen := map[string]int{}
	for i, h := range k.Check.Hidden {
		if !caseRE().MatchString(h) {
			return fmt.Errorf("check.hidden[%d]: %q is not a case name ([A-Za-z0-9._-]{1,128})", i, h)
		}
		if j, ok := seen[h]; ok {
			return fmt.Errorf("check.hidden[%d]: %q is check.hidden[%d] too", i, h, j)
		}
		seen[h] = i
	}
	return nil
}

// checkCommands checks the placeholders of each command and what a
// placeholder-led argument of the run names.
func checkCommands(k *Kit) error {
	for _, c := range []struct {
		field   string
		argv    []string
		allowed []string
	}{
		{"build.command", k.Build.Command, nil},
		{"run.command", k.Run.Command, []string{PlaceBuild, PlaceKit, PlaceOut}},
		{"check.command", k.Check.Command, []string{PlaceKit, PlaceOut}},
	} {
		for i, a := range c.argv {
			name := fmt.Sprintf("%s[%d]", c.field, i)
			for _, p := range []string{PlaceBuild, PlaceKit, PlaceOut} {
				if strings.Contains(a, p) && !contains(c.allowed, p) {
					if len(c.allowed) == 0 {
						return fmt.Errorf("%s: %q: %s has no meaning in %s (it has no placeholders)", name, a, p, c.field)
					}
					return fmt.Errorf("%s: %q: %s has no meaning in %s (it has %s)", name, a, p, c.field, strings.Join(c.allowed, " "))
				}
			}
			if m := placeRE().FindString(a); m != "" && !contains([]string{PlaceBuild + "/", PlaceKit + "/", PlaceOut + "/"}, m) {
				return fmt.Errorf("%s: %q: %s is not a placeholder (%s %s %s)", name, a, m[:len(m)-1], PlaceBuild, PlaceKit, PlaceOut)
			}
			if c.field != "run.command" {
				continue
			}
			for _, pl := range []struct {
				place, list string
				entries     []string
			}{
				{PlaceBuild, "build.outputs", k.Build.Outputs},
				{PlaceKit, "run.copy", k.Run.Copy},
			} {
				rest, ok := strings.CutPrefix(a, pl.place+"/")
				if !ok {
					continue
				}
				rest = strings.TrimSuffix(rest, "/")
				if rest == "" || path.Clean(rest) != rest || !filepath.IsLocal(rest) {
					return fmt.Errorf("%s: %q is not a clean path inside %s", name, a, pl.place)
				}
				if under(rest, pl.entries) < 0 {
					return fmt.Errorf("%s: %q is not among %s", name, a, pl.list)
				}
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// under returns the index of the entry p is, or lies inside; -1 if none.
func under(p string, entries []string) int {
	for i, e := range entries {
		if p == e || strings.HasPrefix(p, e+"/") {
			return i
		}
	}
	return -1
}

// decoder takes typed values out of the decoded manifest; the first
// problem sticks and the rest is skipped.
type decoder struct{ err error }

func (d *decoder) failf(format string, a ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, a...)
	}
}

func field(table, key string) string {
	if table == "" {
		return key
	}
	return table + "." + key
}

// get returns the value of key in table m, or reports it missing.
func (d *decoder) get(m map[string]any, table, key string, required bool) (any, bool) {
	if d.err != nil {
		return nil, false
	}
	v, ok := m[key]
	if !ok && required {
		d.failf("missing field %s", field(table, key))
	}
	return v, ok
}

// show writes a TOML value the way an error quotes it.
func show(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case float64:
		f := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(f, ".eEnN") {
			f += ".0"
		}
		return f
	case int64, bool:
		return fmt.Sprint(x)
	case []any, []map[string]any:
		return "a list"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("a %T", v)
}

func (d *decoder) table(m map[string]any, table, key string, required bool) map[string]any {
	v, ok := d.get(m, table, key, required)
	if !ok {
		return map[string]any{}
	}
	t, isTable := v.(map[string]any)
	if !isTable {
		d.failf("%s: %s is not a table", field(table, key), show(v))
		return map[string]any{}
	}
	return t
}

func (d *decoder) str(m map[string]any, table, key string, required bool) string {
	v, ok := d.get(m, table, key, required)
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		d.failf("%s: %s is not a string", field(table, key), show(v))
		return ""
	}
	if strings.ContainsRune(s, 0) {
		d.failf("%s: %q has a NUL byte", field(table, key), s)
	}
	return s
}

func (d *decoder) strs(m map[string]any, table, key string, required bool) []string {
	v, ok := d.get(m, table, key, required)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		d.failf("%s: %s is not a list of strings", field(table, key), show(v))
		return nil
	}
	out := make([]string, len(list))
	for i, x := range list {
		s, isStr := x.(string)
		if !isStr {
			d.failf("%s[%d]: %s is not a string", field(table, key), i, show(x))
			return nil
		}
		out[i] = s
	}
	return out
}

// argv is a command: a non-empty list of strings, none with a NUL byte,
// the first not empty.
func (d *decoder) argv(m map[string]any, table, key string, required bool) []string {
	argv := d.strs(m, table, key, required)
	if d.err != nil {
		return nil
	}
	name := field(table, key)
	if len(argv) == 0 {
		d.failf("%s: the command is empty", name)
		return nil
	}
	if argv[0] == "" {
		d.failf("%s[0]: the program is empty", name)
	}
	for i, a := range argv {
		if strings.ContainsRune(a, 0) {
			d.failf("%s[%d]: %q has a NUL byte", name, i, a)
		}
	}
	return argv
}

func (d *decoder) int(m map[string]any, table, key string, required bool, def, lo, hi int64) int {
	v, ok := d.get(m, table, key, required)
	if !ok {
		return int(def)
	}
	n, isInt := v.(int64)
	if !isInt {
		d.failf("%s: %s is not an integer", field(table, key), show(v))
		return 0
	}
	if n < lo || n > hi {
		d.failf("%s: %d is out of range %d..%d", field(table, key), n, lo, hi)
		return 0
	}
	return int(n)
}

func (d *decoder) limits(parent map[string]any, section string) Limits {
	t := d.table(parent, section, "limits", false)
	table := section + ".limits"
	var l Limits
	if v, ok := d.get(t, table, "timeout", false); ok {
		s, isStr := v.(string)
		dur, err := time.ParseDuration(s)
		switch {
		case !isStr || err != nil:
			d.failf("%s.timeout: %s is not a duration (like \"30s\" or \"5m\")", table, show(v))
		case dur != 0 && (dur < time.Millisecond || dur > MaxTimeout):
			d.failf("%s.timeout: %q is out of range 0 or 1ms..%s", table, s, shortDuration(MaxTimeout))
		}
		l.Timeout = dur
	}
	l.Processes = d.int(t, table, "processes", false, 0, 0, MaxProcesses)
	l.OpenFiles = d.int(t, table, "open_files", false, 0, 0, MaxOpenFiles)
	l.AddressSpaceMB = int64(d.int(t, table, "address_space_mb", false, 0, 0, MaxMB))
	l.FileSizeMB = int64(d.int(t, table, "file_size_mb", false, 0, 0, MaxMB))
	l.CPUSeconds = d.int(t, table, "cpu_seconds", false, 0, 0, MaxCPUSecs)
	return l
}

func shortDuration(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	return strings.TrimSuffix(s, "0m")
}

// paths reads a list of relative paths inside place ("the kit", "the
// build folder"), none inside another.
func (d *decoder) paths(m map[string]any, table, key string, required bool, place string) []string {
	list := d.strs(m, table, key, required)
	if d.err != nil {
		return nil
	}
	name := field(table, key)
	if required && len(list) == 0 {
		d.failf("%s: the list is empty", name)
		return nil
	}
	out := make([]string, len(list))
	for i, p := range list {
		clean, err := relPath(p, place)
		if err != nil {
			d.failf("%s[%d]: %v", name, i, err)
			return nil
		}
		for j, q := range out[:i] {
			if clean == q || strings.HasPrefix(clean, q+"/") || strings.HasPrefix(q, clean+"/") {
				d.failf("%s[%d]: %q overlaps %s[%d] %q", name, i, p, name, j, list[j])
				return nil
			}
		}
		out[i] = clean
	}
	return out
}

// relPath checks a relative path inside place and returns it without its
// trailing "/".
func relPath(p, place string) (string, error) {
	s := strings.TrimSuffix(p, "/")
	switch {
	case p == "":
		return "", errors.New("the path is empty")
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%q has a NUL byte", p)
	case strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("%q is absolute: paths are relative to %s", p, place)
	case s == "." || s == "":
		return "", fmt.Errorf("%q is the whole of %s: name its files or folders", p, place)
	case !filepath.IsLocal(s) || strings.HasPrefix(path.Clean(s), "../"):
		return "", fmt.Errorf("%q leaves %s", p, place)
	case path.Clean(s) != s:
		return "", fmt.Errorf("%q is not a clean path (write %q)", p, path.Clean(s))
	}
	return s, nil
}

// outPath reads run.stdout or run.stderr: a path under out/.
func (d *decoder) outPath(m map[string]any, table, key string) string {
	p := d.str(m, table, key, false)
	if d.err != nil || p == "" {
		return ""
	}
	clean, err := relPath(p, "the run folder")
	if err == nil && (p != clean || !strings.HasPrefix(clean, "out/")) {
		err = fmt.Errorf("%q is not a file under out/", p)
	}
	if err != nil {
		d.failf("%s: %v", field(table, key), err)
		return ""
	}
	return clean
}

// checkFiles checks the kit's folder against the manifest: every symlink
// stays inside the kit, nothing but files, folders and symlinks, run.copy's
// entries exist and carry no symlink to what the run will not have, and a
// check program named by a relative path is an executable file of the kit.
func checkFiles(rootfd int, k *Kit) error {
	realRoot, err := fdPath(rootfd)
	if err != nil {
		return err
	}
	links := map[string]string{} // symlink -> what it resolves to, both relative to the kit
	// Walk the folder the descriptor holds, so that a kit reached through
	// a symlinked path is walked, not taken for a symlink itself.
	err = filepath.WalkDir(realRoot, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(realRoot, p)
		t := e.Type()
		switch {
		case t.IsDir() || t.IsRegular():
			return nil
		case t&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			to, err := resolve(rootfd, realRoot, rel)
			if err != nil {
				return fmt.Errorf("%s: symlink to %q %v", rel, target, err)
			}
			links[rel] = to
			return nil
		default:
			return fmt.Errorf("%s: %s has no place in a kit (only files, folders and symlinks)", rel, typeName(t))
		}
	})
	if err != nil {
		return err
	}
	linkNames := make([]string, 0, len(links))
	for l := range links {
		linkNames = append(linkNames, l)
	}
	sort.Strings(linkNames) // so that the first problem reported is always the same
	for i, c := range k.Run.Copy {
		name := fmt.Sprintf("run.copy[%d]", i)
		fd, err := confined.OpenBeneath(rootfd, c, unix.O_PATH|unix.O_NOFOLLOW, 0, confined.NoSymlinks)
		switch {
		case errors.Is(err, unix.ENOENT):
			return fmt.Errorf("%s: %q is not in the kit", name, c)
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
			return fmt.Errorf("%s: %q goes through a symlink", name, c)
		case err != nil:
			return fmt.Errorf("%s: %q: %w", name, c, err)
		}
		unix.Close(fd)
		// What a run will have: the copied entries. A symlink carried by
		// this entry must point at one of them.
		for _, l := range linkNames {
			to := links[l]
			if l != c && !strings.HasPrefix(l, c+"/") {
				continue
			}
			if under(to, k.Run.Copy) < 0 {
				return fmt.Errorf("%s: %s is a symlink to %q, which run.copy does not copy", name, l, to)
			}
		}
	}
	if prog := k.Check.Command[0]; !filepath.IsAbs(prog) && strings.Contains(prog, "/") && !strings.Contains(prog, "{") {
		clean := path.Clean(prog)
		if !filepath.IsLocal(clean) {
			return fmt.Errorf("check.command[0]: %q leaves the kit", prog)
		}
		fd, err := confined.OpenBeneath(rootfd, clean, unix.O_PATH, 0, confined.FollowInside)
		if err != nil {
			return fmt.Errorf("check.command[0]: %q is not in the kit", prog)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		switch {
		case err != nil:
			return fmt.Errorf("check.command[0]: %q: %w", prog, err)
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			return fmt.Errorf("check.command[0]: %q is not a file", prog)
		case st.Mode&0o111 == 0:
			return fmt.Errorf("check.command[0]: %q is not executable (chmod +x it, or run it with sh)", prog)
		}
	}
	return nil
}

// resolve follows the symlink rel beneath the kit, as the kernel would with
// the kit as its root, and returns where it leads, relative to the kit.
func resolve(rootfd int, realRoot, rel string) (string, error) {
	fd, err := confined.OpenBeneath(rootfd, rel, unix.O_PATH, 0, confined.FollowInside)
	switch {
	case errors.Is(err, unix.EXDEV):
		return "", errors.New("leads out of the kit")
	case errors.Is(err, unix.ENOENT):
		return "", errors.New("points to nothing")
	case errors.Is(err, unix.ELOOP):
		return "", errors.New("is a loop")
	case err != nil:
		return "", err
	}
	defer unix.Close(fd)
	p, err := fdPath(fd)
	if err != nil {
		return "", err
	}
	to, err := filepath.Rel(realRoot, p)
	if err != nil || !filepath.IsLocal(to) && to != "." {
		return "", errors.New("leads out of the kit")
	}
	if to == "." {
		return "", errors.New("points at the kit's own folder")
	}
	return to, nil
}

// fdPath is the path the kernel has for a descriptor.
func fdPath(fd int) (string, error) {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", fmt.Errorf("reading the kit's paths needs /proc: %w", err)
	}
	return p, nil
}

func typeName(t fs.FileMode) string {
	switch {
	case t&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeCharDevice != 0:
		return "a character device"
	case t&fs.ModeDevice != 0:
		return "a block device"
	}
	return "a special file"
}

package kit

import (
	"bytes"
	"encoding/json"
	"path"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// FuzzParseManifest parses any kit.toml. What it accepts keeps every
// promise the manifest's documentation makes (names, ranges, clean
// relative paths that overlap nowhere, outputs under out/, placeholders
// only where they mean something), and written back as TOML it parses
// to the same kit.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(goodManifest))
	f.Add([]byte("name = \"x\"\n[build]\ncommand = [\"make\"]\noutputs = [\"a\"]\n[run]\ncommand = [\"{build}/a\"]\nrepeats = 1\n[check]\ncommand = [\"true\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := Parse(data, "fuzz")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("the error is more than one line: %q", err)
			}
			return
		}
		checkAccepted(t, k)
		again, err := Parse(encodeKit(t, k), "fuzz again")
		if err != nil {
			t.Fatalf("the kit written back is refused: %v\n%s", err, encodeKit(t, k))
		}
		if a, b := normal(k), normal(again); !reflect.DeepEqual(a, b) {
			t.Fatalf("written back, the kit changed:\n%#v\n%#v", a, b)
		}
	})
}

// checkAccepted asserts what the documentation promises of an accepted kit.
func checkAccepted(t *testing.T, k *Kit) {
	t.Helper()
	if !nameRE().MatchString(k.Name) {
		t.Fatalf("name %q accepted", k.Name)
	}
	for _, argv := range [][]string{k.Build.Command, k.Run.Command, k.Check.Command} {
		if len(argv) == 0 || argv[0] == "" {
			t.Fatalf("an empty command accepted: %q", argv)
		}
		for _, a := range argv {
			if strings.ContainsRune(a, 0) {
				t.Fatalf("a NUL byte in %q accepted", argv)
			}
		}
	}
	for _, a := range k.Build.Command {
		if strings.Contains(a, PlaceBuild) || strings.Contains(a, PlaceKit) || strings.Contains(a, PlaceOut) {
			t.Fatalf("a placeholder in build.command accepted: %q", a)
		}
	}
	for _, a := range k.Check.Command {
		if strings.Contains(a, PlaceBuild) {
			t.Fatalf("{build} in check.command accepted: %q", a)
		}
	}
	for _, list := range [][]string{k.Build.Outputs, k.Run.Copy} {
		for i, p := range list {
			if p == "" || p == "." || filepath.IsAbs(p) || !filepath.IsLocal(p) || path.Clean(p) != p {
				t.Fatalf("the path %q accepted", p)
			}
			for _, q := range list[:i] {
				if under(p, []string{q}) >= 0 || under(q, []string{p}) >= 0 {
					t.Fatalf("the paths %q and %q overlap", p, q)
				}
			}
		}
	}
	if len(k.Build.Outputs) == 0 {
		t.Fatal("a kit without build.outputs accepted")
	}
	// Every {build}/ and {kit}/ argument of the run names something the
	// run will have.
	for _, a := range k.Run.Command {
		if rest, ok := strings.CutPrefix(a, PlaceBuild+"/"); ok && under(strings.TrimSuffix(rest, "/"), k.Build.Outputs) < 0 {
			t.Fatalf("run.command's %q names no build output", a)
		}
		if rest, ok := strings.CutPrefix(a, PlaceKit+"/"); ok && under(strings.TrimSuffix(rest, "/"), k.Run.Copy) < 0 {
			t.Fatalf("run.command's %q names no run.copy entry", a)
		}
	}
	for _, p := range []string{k.Run.Stdout, k.Run.Stderr} {
		if p != "" && (!strings.HasPrefix(p, "out/") || !filepath.IsLocal(p) || path.Clean(p) != p) {
			t.Fatalf("the output %q accepted", p)
		}
	}
	if k.Run.Stdout != "" && k.Run.Stdout == k.Run.Stderr {
		t.Fatal("stdout and stderr to one file accepted")
	}
	r := k.Run
	if r.Repeats < 1 || r.Repeats > MaxRepeats || r.CPUs < 1 || r.CPUs > MaxCPUs || r.Cards < 0 || r.Cards > MaxCards {
		t.Fatalf("run's numbers out of range: %+v", r)
	}
	for _, l := range []Limits{k.Build.Limits, k.Run.Limits} {
		if l.Timeout != 0 && (l.Timeout < time.Millisecond || l.Timeout > MaxTimeout) || l.Timeout < 0 ||
			l.Processes < 0 || l.Processes > MaxProcesses || l.OpenFiles < 0 || l.OpenFiles > MaxOpenFiles ||
			l.AddressSpaceMB < 0 || l.AddressSpaceMB > MaxMB || l.FileSizeMB < 0 || l.FileSizeMB > MaxMB ||
			l.CPUSeconds < 0 || l.CPUSeconds > MaxCPUSecs {
			t.Fatalf("limits out of range: %+v", l)
		}
		if l.Timeout > 0 && l.RPC().TimeoutMS <= 0 {
			t.Fatalf("a timeout of %s goes to the broker as %d ms, the default", l.Timeout, l.RPC().TimeoutMS)
		}
	}
	if !publicRE().MatchString(k.Check.Public) || k.Check.Public == "cases" {
		t.Fatalf("check.public %q accepted", k.Check.Public)
	}
	seen := map[string]bool{}
	for _, h := range k.Check.Hidden {
		if !caseRE().MatchString(h) || seen[h] {
			t.Fatalf("check.hidden %q accepted", k.Check.Hidden)
		}
		seen[h] = true
	}
}

// encodeKit writes k as a manifest.
func encodeKit(t *testing.T, k *Kit) []byte {
	t.Helper()
	limits := func(l Limits) map[string]any {
		m := map[string]any{}
		if l.Timeout != 0 {
			m["timeout"] = l.Timeout.String()
		}
		for key, v := range map[string]int64{"processes": int64(l.Processes), "open_files": int64(l.OpenFiles), "address_space_mb": l.AddressSpaceMB, "file_size_mb": l.FileSizeMB, "cpu_seconds": int64(l.CPUSeconds)} {
			if v != 0 {
				m[key] = v
			}
		}
		return m
	}
	run := map[string]any{"command": k.Run.Command, "copy": k.Run.Copy, "repeats": k.Run.Repeats, "cpus": k.Run.CPUs, "cards": k.Run.Cards, "limits": limits(k.Run.Limits)}
	if k.Run.Stdout != "" {
		run["stdout"] = k.Run.Stdout
	}
	if k.Run.Stderr != "" {
		run["stderr"] = k.Run.Stderr
	}
	m := map[string]any{
		"name":        k.Name,
		"description": k.Description,
		"build":       map[string]any{"command": k.Build.Command, "outputs": k.Build.Outputs, "limits": limits(k.Build.Limits)},
		"run":         run,
		"check":       map[string]any{"command": k.Check.Command, "hidden": k.Check.Hidden, "public": k.Check.Public},
	}
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(m); err != nil {
		t.Fatalf("encoding the kit: %v", err)
	}
	return b.Bytes()
}

// normal is k with empty lists as nil, so that "absent" and "[]" compare
// equal.
func normal(k *Kit) Kit {
	n := *k
	for _, l := range []*[]string{&n.Build.Outputs, &n.Run.Copy, &n.Check.Hidden} {
		if len(*l) == 0 {
			*l = nil
		}
	}
	return n
}

// FuzzParseCheck splits any check output for a kit with any public name
// and hidden cases. No hidden case ever reaches the public result or its
// JSON, every hidden result is one the kit names, and the public JSON
// reads back, through the same contract, as the same public result.
func FuzzParseCheck(f *testing.F) {
	f.Add([]byte(`{"score": 0.75, "cases": {"case1": {"ok": true}, "case3": {"ok": false}}}`), "score", "case3")
	f.Add([]byte(`{"score":1,"cases":{"case\u0033":7}}`), "score", "case3")
	f.Add([]byte(`{"acc":1e308,"cases":{}}`), "acc", "")
	f.Fuzz(func(t *testing.T, out []byte, public, hidden string) {
		k := &Kit{Name: "fuzz", Check: Check{Public: "score"}}
		if publicRE().MatchString(public) && public != "cases" {
			k.Check.Public = public
		}
		seen := map[string]bool{}
		for _, h := range strings.Split(hidden, ",") {
			if caseRE().MatchString(h) && !seen[h] {
				k.Check.Hidden = append(k.Check.Hidden, h)
				seen[h] = true
			}
		}
		pub, hid, err := ParseCheck(out, k)
		if err != nil {
			return
		}
		for c := range hid {
			if !k.IsHidden(c) {
				t.Fatalf("case %q went to the hidden results, which the kit does not name", c)
			}
		}
		for c := range pub.Cases {
			if k.IsHidden(c) {
				t.Fatalf("hidden case %q is in the public result", c)
			}
		}
		js, err := json.Marshal(pub)
		if err != nil {
			t.Fatalf("the public result does not encode: %v", err)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(js, &top); err != nil {
			t.Fatalf("the public JSON %s does not decode: %v", js, err)
		}
		var cases map[string]json.RawMessage
		if err := json.Unmarshal(top["cases"], &cases); err != nil {
			t.Fatalf("the public JSON's cases do not decode: %v", err)
		}
		for c := range cases {
			if k.IsHidden(c) {
				t.Fatalf("hidden case %q is in the public JSON %s", c, js)
			}
		}
		back, err := DecodeCheck(js, k.Check.Public)
		if err != nil {
			t.Fatalf("the public JSON %s breaks the contract: %v", js, err)
		}
		// json.Marshal escapes HTML in what MarshalJSON writes, so the
		// cases compare as values, not as bytes.
		if back.Score != pub.Score || !reflect.DeepEqual(values(t, back.Cases), values(t, pub.Cases)) {
			t.Fatalf("the public JSON %s reads back as %+v, not %+v", js, back, pub)
		}
	})
}

// values decodes each case's result.
func values(t *testing.T, cases map[string]json.RawMessage) map[string]any {
	t.Helper()
	out := map[string]any{}
	for c, raw := range cases {
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber() // 1e400 is a valid result, and no float64
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("case %q: %v", c, err)
		}
		out[c] = v
	}
	return out
}

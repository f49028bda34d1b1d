package statedir_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"thermite/internal/config"
	"thermite/internal/statedir"
)

// seeds are documents whose values hold text a line scanner would take
// for keys or headers.
var seeds = []string{
	"state_dir = \"/srv/rig\"\n",
	"# state_dir = \"/commented\"\nlanes = 4\n[limits]\nprocesses = 300\n",
	"strip_env_prefixes = [\n  \"RUNPOD_\", # state_dir = \"/in-a-comment\"\n  \"X_\",\n]\nstate_dir = '/srv/literal'\n",
	"role_prefix = \"\"\"\nstate_dir = \"/in-a-string\"\n[fake]\n\"\"\"\nstate_dir = \"/srv/after\"\n",
	"role_prefix = '''\n[fake]\n'''\n[cgroup]\nstate_dir = 1\n",
	"\"state_dir\" = \"/srv/quoted-key\"\n",
	"state_dir = \"/srv/\\u0072ig\"\r\nlanes = 2\r\n",
	"\uFEFFstate_dir = \"/srv/bom\" # a comment\n",
	"closed_tmp = [[\"/a\"], [\"]\"]]\nstate_dir = \"/srv/nested\"\n",
	"network = { lane = \"api\" }\nstate_dir = \"/srv/inline\"\n",
	"when = 1979-05-27 07:32:00Z\nstate_dir = \"/srv/date\"\n",
	"x = \"\"\"a\\\"\"\"\"\"\nstate_dir = \"/srv/quotes\"\n",
	"state_dir = \"\"\"/srv/multi\"\"\"\n",
	"state_dir = \"\"\"\n/srv/\\\n   multi\"\"\"\n",
	"state_dir = '''\n/srv/lit'''\n",
	"state_dir = \"relative\"\n",
	"state_dir = \"/srv/a\"\nstate_dir = \"/srv/b\"\n",
	"State_Dir = \"/srv/case\"\n",
	"state_dir = \"/srv/a\"\nSTATE_DIR = \"/srv/b\"\n",
	"state_dir.x = 1\n",
	"[state_dir]\n",
	"lanes = 4\nstate_dir = 7\n",
}

// FuzzFindAgreesWithTheDecoder: for any document the TOML decoder reads,
// Find gives the decoder's state_dir (or its absence); and for any file
// config.Load accepts, Lookup finds the same state folder.
// So thermite-run-as and the broker never look for the socket in two
// places.
func FuzzFindAgreesWithTheDecoder(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir, found, err := statedir.Find(data)
		var doc struct {
			StateDir *string `toml:"state_dir"`
		}
		if _, derr := toml.Decode(string(data), &doc); derr == nil {
			switch {
			case err != nil && !strings.Contains(err.Error(), "state_dir: given twice"):
				// Two spellings (state_dir, STATE_DIR) decode, the one
				// taken left to a map's order: Find refuses them.
				t.Fatalf("the decoder reads it, Find refuses it: %v", err)
			case err == nil && found != (doc.StateDir != nil):
				t.Fatalf("Find found state_dir %v (%q), the decoder %v", found, dir, doc.StateDir != nil)
			case err == nil && found && dir != *doc.StateDir:
				t.Fatalf("Find read state_dir %q, the decoder %q", dir, *doc.StateDir)
			}
		}
		p := filepath.Join(t.TempDir(), "rig.toml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := config.Load(p)
		if err != nil {
			return
		}
		got, err := statedir.Lookup(p)
		if err != nil && !strings.Contains(err.Error(), "state_dir: given twice") {
			t.Fatalf("config.Load accepts it, Lookup refuses it: %v", err)
		}
		if err == nil && got != c.StateDir {
			t.Fatalf("Lookup found %q, config.Load %q", got, c.StateDir)
		}
	})
}

// TestLookupRefusesWhatConfigRefusesInStateDir: a state_dir that is not a
// usable folder, given twice, or written as something other than a
// string is one line naming the file and the key.
func TestLookupRefusesWhatConfigRefusesInStateDir(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ text, want string }{
		{"state_dir = \"relative\"\n", `state_dir: "relative" must be an absolute, clean path`},
		{"state_dir = \"/srv/../etc\"\n", "must be an absolute, clean path"},
		{"state_dir = \"/\"\n", "state_dir: must not be /"},
		{"state_dir = \"/srv/a\"\nstate_dir = \"/srv/b\"\n", "state_dir: given twice"},
		{"state_dir = 7\n", "state_dir: line 1: must be a quoted string"},
		{"state_dir.x = 1\n", "state_dir: must be a string"},
		{"state_dir = \"/srv\n", "a string without its closing quote"},
	} {
		p := filepath.Join(dir, "rig.toml")
		os.WriteFile(p, []byte(c.text), 0o600)
		_, err := statedir.Lookup(p)
		if err == nil || !strings.HasPrefix(err.Error(), "config "+p+": ") || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v; want one line naming %s with %q", c.text, err, p, c.want)
		}
		if _, cerr := config.Load(p); cerr == nil {
			t.Errorf("%q: config.Load accepts what Lookup refuses", c.text)
		}
	}
	// Two spellings of the key: config.Load takes one of them, which one
	// left to a map's order; Lookup refuses to guess.
	p := filepath.Join(dir, "rig.toml")
	os.WriteFile(p, []byte("state_dir = \"/srv/a\"\nSTATE_DIR = \"/srv/b\"\n"), 0o600)
	if _, err := statedir.Lookup(p); err == nil || !strings.Contains(err.Error(), "line 2: state_dir: given twice") {
		t.Errorf("state_dir and STATE_DIR: %v; want a refusal naming line 2", err)
	}
	if _, err := statedir.Lookup(filepath.Join(dir, "missing.toml")); err == nil || !strings.HasPrefix(err.Error(), "config: open ") {
		t.Errorf("a --config that does not exist: %v; want config: open ...", err)
	}
}

// TestLookupTakesTheDefaultsConfigTakes: a file without state_dir, and
// the seeds config.Load accepts, give config.Load's state folder and
// broker socket.
func TestLookupTakesTheDefaultsConfigTakes(t *testing.T) {
	dir := t.TempDir()
	for _, text := range append([]string{"lanes = 4\n", ""}, seeds...) {
		p := filepath.Join(dir, "rig.toml")
		os.WriteFile(p, []byte(text), 0o600)
		c, err := config.Load(p)
		if err != nil {
			continue
		}
		got, err := statedir.Lookup(p)
		if err != nil && strings.Contains(err.Error(), "state_dir: given twice") {
			continue
		}
		if err != nil || statedir.BrokerSocket(got) != c.BrokerSocket() {
			t.Errorf("%q: Lookup %q %v; config.Load's socket %s", text, got, err, c.BrokerSocket())
		}
	}
}

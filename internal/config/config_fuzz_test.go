package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzLoad loads any rig.toml. What Load accepts validates again, and
// goes through both forms it travels in unchanged: the TOML that
// `thermite config` prints (Encode) loads back to the same configuration,
// and the JSON the broker hands the controller decodes to it too.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("lanes = 4\nrole_prefix = \"t-\"\n[limits]\nwall_timeout = \"90s\"\n"))
	f.Add([]byte("[network]\nlane = \"api\"\n[api]\ntcp = \"[::1]:7700\"\n"))
	f.Add([]byte("judge_cpus = \"0-3,8\"\nclosed_tmp = [\"/tmp\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "rig.toml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted what Validate refuses: %v", err)
		}
		if c.Source != p {
			t.Fatalf("Source is %q, not %q", c.Source, p)
		}
		text, err := c.Encode()
		if err != nil {
			t.Fatalf("an accepted configuration does not encode: %v", err)
		}
		p2 := filepath.Join(dir, "again.toml")
		if err := os.WriteFile(p2, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		again, err := Load(p2)
		if err != nil {
			t.Fatalf("the printed configuration is refused: %v\n%s", err, text)
		}
		again.Source = c.Source
		if !reflect.DeepEqual(normalConfig(c), normalConfig(again)) {
			t.Fatalf("printed and loaded again, the configuration changed:\n%+v\n%+v\n%s", c, again, text)
		}
		js, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("an accepted configuration does not encode as JSON: %v", err)
		}
		var fromJSON Config
		if err := json.Unmarshal(js, &fromJSON); err != nil {
			t.Fatalf("the controller cannot read the configuration it is given: %v\n%s", err, js)
		}
		if !reflect.DeepEqual(normalConfig(c), normalConfig(fromJSON)) {
			t.Fatalf("through JSON, the configuration changed:\n%+v\n%+v", c, fromJSON)
		}
		// Paths the rig joins and hands to the kernel hold no NUL byte.
		paths := []string{c.StateDir, c.SecretsDir, c.API.Socket, c.GPU.DevRoot, c.GPU.ProcRoot, c.Host.ProcRoot, c.Host.SysRoot, c.Image.SupervisorDir, c.Image.Inbox, c.Image.Outbox}
		for _, s := range append(paths, c.ClosedTmp...) {
			if strings.ContainsRune(s, 0) {
				t.Fatalf("a path with a NUL byte accepted: %q", s)
			}
		}
	})
}

// normalConfig is c with empty lists and maps as nil, so that "absent"
// and "[]" compare equal where the rig treats them alike.
func normalConfig(c Config) Config {
	if len(c.ClosedTmp) == 0 {
		c.ClosedTmp = nil
	}
	if len(c.Network) == 0 {
		c.Network = nil
	}
	if len(c.Perf) == 0 {
		c.Perf = nil
	}
	if len(c.StripEnvPrefixes) == 0 {
		c.StripEnvPrefixes = nil
	}
	if len(c.Host.SetIDDirs) == 0 {
		c.Host.SetIDDirs = nil
	}
	return c
}

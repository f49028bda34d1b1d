package trialclient

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"thermite/internal/lanefs"
)

// TestTrialFoundFromEnvFlagsOrAgentFolder: the flags stand for the
// variables, an agent's folder (HOME) is read when neither is given, and
// a missing piece is one line naming the variables.
func TestTrialFoundFromEnvFlagsOrAgentFolder(t *testing.T) {
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, "token"), []byte("tok-home\n"), 0o600)
	os.WriteFile(filepath.Join(home, "trial.json"), []byte(`{"id":"t1","api_socket":"/run/api.sock"}`), 0o600)
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	c, err := FromEnv(env(map[string]string{"HOME": home}))
	if err != nil || c.token != "tok-home" || c.socket != "/run/api.sock" {
		t.Fatalf("from the agent's folder: %+v %v", c, err)
	}
	c, err = FromEnv(env(map[string]string{EnvSocket: "/s", EnvToken: " tok "}))
	if err != nil || c.token != "tok" || c.socket != "/s" {
		t.Fatalf("from the variables: %+v %v", c, err)
	}
	if _, err := FromEnv(env(map[string]string{EnvSocket: "/s"})); err == nil || !strings.Contains(err.Error(), "THERMITE_TOKEN and THERMITE_TOKEN_FILE are unset") {
		t.Fatalf("no token: %v", err)
	}
	if _, err := FromEnv(env(map[string]string{EnvToken: "x"})); err == nil || !strings.Contains(err.Error(), "THERMITE_API_SOCKET and THERMITE_API_URL are unset") {
		t.Fatalf("no API: %v", err)
	}
	var out, errb bytes.Buffer
	// The flags: a refused connection to a socket that is not there names it.
	code := run([]string{"--socket", filepath.Join(home, "nope.sock"), "--token-file", filepath.Join(home, "token"), "trial"}, env(nil), nil, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "nope.sock") || strings.Count(errb.String(), "\n") != 1 {
		t.Fatalf("flags: %d %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"--bogus", "trial"}, env(nil), nil, &out, &errb); code != 1 || !strings.HasPrefix(errb.String(), "thermite-trial: unknown flag --bogus") {
		t.Fatalf("unknown flag: %d %q", code, errb.String())
	}
}

// TestEveryFileOpHasACommand: each operation of the file helper
// (lanefs.Ops) is a command, `fs OP`, that posts to its route; one that
// changes nothing is `research OP` too, and one that changes files is
// refused under research, where nothing may change.
func TestEveryFileOpHasACommand(t *testing.T) {
	var got []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{}")
	}))
	defer api.Close()
	env := func(k string) string { return map[string]string{EnvURL: api.URL, EnvToken: "tok"}[k] }
	for _, op := range lanefs.Ops {
		fc, ok := fileCommandOf("fs", op.Name)
		if !ok {
			t.Errorf("no command fs %s", op.Name)
			continue
		}
		args := []string{"a", "b", "c"}[:fc.min]
		for _, group := range []string{"fs", "research"} {
			got = nil
			var out, errb bytes.Buffer
			code := run(append([]string{group, op.Name}, args...), env, strings.NewReader(""), &out, &errb)
			switch {
			case group == "research" && op.Changes:
				if code != 1 || errb.String() != fmt.Sprintf("thermite-trial: no command \"research %s\"; see thermite-trial --help\n", op.Name) || got != nil {
					t.Errorf("research %s: %d %q, posted %v", op.Name, code, errb.String(), got)
				}
			case code != 0 || len(got) != 1 || got[0] != "POST /v1/"+group+"/"+op.Name:
				t.Errorf("%s %s: %d %q, posted %v", group, op.Name, code, errb.String(), got)
			}
		}
		if !strings.Contains(Usage, "  fs "+op.Name+" ") {
			t.Errorf("the help has no line for fs %s", op.Name)
		}
	}
	if len(fileOps) != len(lanefs.Ops) {
		t.Errorf("%d file commands for %d operations", len(fileOps), len(lanefs.Ops))
	}
}

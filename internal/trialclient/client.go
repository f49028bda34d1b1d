// Package trialclient is thermite-trial, the worker agent's client of the
// harness API: the research, step, file and exec tools of its trial as
// commands (plain text, or the API's JSON with --json) and as an MCP
// server over stdio. It is the thermite binary run under the name
// thermite-trial, or as `thermite trial-client`; it keeps no state of
// its own and does nothing at package init, as the stop helper and the
// probe run through the same binary.
package trialclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"thermite/internal/apiwire"
)

// The environment thermite gives every process of a trial's agent (and a
// lane agent's): where the API is and the trial's token.
const (
	EnvSocket    = "THERMITE_API_SOCKET" // the API's unix socket
	EnvURL       = "THERMITE_API_URL"    // its TCP address, where the rig serves one
	EnvTokenFile = "THERMITE_TOKEN_FILE" // a file holding the token
	EnvToken     = "THERMITE_TOKEN"      // the token itself (instead of the file)
	EnvTrial     = "THERMITE_TRIAL"      // the trial's id, for messages
)

// Client calls the harness API with a trial's token.
type Client struct {
	Trial  string
	token  string
	base   string
	http   *http.Client
	socket string
}

// FromEnv finds the trial from the environment: the socket (or URL;
// else the api_socket of $HOME/trial.json) and the token (THERMITE_TOKEN,
// else the file THERMITE_TOKEN_FILE names, else $HOME/token: an agent's
// folder, its HOME, holds both files). It names the variable at fault
// when one is missing.
func FromEnv(getenv func(string) string) (*Client, error) {
	token := strings.TrimSpace(getenv(EnvToken))
	if token == "" {
		file := getenv(EnvTokenFile)
		if file == "" && getenv("HOME") != "" {
			if _, err := os.Stat(filepath.Join(getenv("HOME"), "token")); err == nil {
				file = filepath.Join(getenv("HOME"), "token")
			}
		}
		if file == "" {
			return nil, fmt.Errorf("no trial token: %s and %s are unset (thermite sets them for a trial's agent)", EnvToken, EnvTokenFile)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("the trial token (%s): %w", EnvTokenFile, err)
		}
		token = strings.TrimSpace(string(b))
	}
	socket, url := getenv(EnvSocket), strings.TrimRight(getenv(EnvURL), "/")
	if socket == "" && url == "" && getenv("HOME") != "" {
		// An agent's folder, its HOME, holds the trial's details.
		var info apiwire.TrialInfo
		if b, err := os.ReadFile(filepath.Join(getenv("HOME"), "trial.json")); err == nil && json.Unmarshal(b, &info) == nil {
			socket = info.APISocket
		}
	}
	if socket == "" && url == "" {
		return nil, fmt.Errorf("no harness API: %s and %s are unset (thermite sets them for a trial's agent)", EnvSocket, EnvURL)
	}
	return New(socket, url, token, getenv(EnvTrial)), nil
}

// New is a client of the API on socket (preferred) or at url.
func New(socket, url, token, trial string) *Client {
	c := &Client{Trial: trial, token: token, socket: socket, base: url}
	tr := &http.Transport{}
	if socket != "" {
		c.base = "http://api"
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}
	}
	c.http = &http.Client{Transport: tr}
	return c
}

// toolKey holds, in a request's context, the MCP tool it serves: the
// API records its call under that name (apiwire.ToolHeader).
type toolKey struct{}

// Refused is the API's refusal: its status, stable code and one line.
type Refused struct {
	Status int
	Code   string
	Detail string
}

func (e *Refused) Error() string {
	return fmt.Sprintf("%s (%s, %d)", e.Detail, e.Code, e.Status)
}

// Do sends one request and decodes a 200 answer into out (when not nil),
// or returns the API's refusal.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: the answer is not JSON: %w", method, path, err)
	}
	return nil
}

// send posts a request and returns a 200 answer, open; any other is
// read as a problem and returned as *Refused.
func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := apiBody(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if tool, ok := ctx.Value(toolKey{}).(string); ok {
		req.Header.Set(apiwire.ToolHeader, tool)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the harness API (%s): %w", c.where(), err)
	}
	if resp.StatusCode == 200 {
		return resp, nil
	}
	defer resp.Body.Close()
	var p apiwire.Problem
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(raw, &p) != nil || p.Detail == "" {
		return nil, &Refused{Status: resp.StatusCode, Code: "unexplained", Detail: fmt.Sprintf("%s %s answered %s", method, path, resp.Status)}
	}
	return nil, &Refused{Status: p.Status, Code: p.Code, Detail: p.Detail}
}

func (c *Client) where() string {
	if c.socket != "" {
		return c.socket
	}
	return c.base
}

// ExecResult is a finished exec: its output (capped by the API) and how
// it ended.
type ExecResult struct {
	Stdout, Stderr []byte
	Last           apiwire.ExecFrame
}

// Exec runs a command as the lane and calls each frame's bytes to
// stdout or stderr as they come; it returns the last frame.
func (c *Client) Exec(ctx context.Context, req apiwire.ExecRequest, stdout, stderr io.Writer) (apiwire.ExecFrame, error) {
	resp, err := c.send(ctx, "POST", "/v1/exec", req)
	if err != nil {
		return apiwire.ExecFrame{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		var f apiwire.ExecFrame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return apiwire.ExecFrame{}, fmt.Errorf("exec: a frame is not JSON: %w", err)
		}
		if f.Done {
			return f, nil
		}
		w := stdout
		if f.Stream == "stderr" {
			w = stderr
		}
		io.WriteString(w, f.Data)
		w.Write(f.DataB64)
	}
	if err := sc.Err(); err != nil {
		return apiwire.ExecFrame{}, fmt.Errorf("exec: %w", err)
	}
	return apiwire.ExecFrame{}, errors.New("exec: the answer ended before the command did")
}

// ExitCode is the code a shell gives a command that ended as f says:
// its own, 124 for a timeout, 128+N for signal N, 127 when it never ran.
func ExitCode(f apiwire.ExecFrame) int {
	switch {
	case f.Error != "" && f.ExitCode == -1 && f.Signal == 0:
		return 127
	case f.Stopped == "timeout":
		return 124
	case f.Signal != 0:
		return 128 + f.Signal
	}
	return f.ExitCode
}

// timeoutMS parses a duration flag into the API's milliseconds.
func timeoutMS(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--timeout %q: not a positive duration such as 90s or 5m", s)
	}
	return d.Milliseconds(), nil
}

// apiBody is a request as the API takes it: the file helper's request
// types, less their root, which the API pins and refuses from a caller.
func apiBody(in any) ([]byte, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m["root"] == nil {
		return b, nil
	}
	delete(m, "root")
	return json.Marshal(m)
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"thermite/controller/ledger"
	"thermite/internal/termsafe"
)

// trialEventsCmd is `thermite trial events TRIAL [--follow] [--json]`:
// the trial's events from the ledger, one a line, and with --follow those
// recorded after, until the trial ends.
func trialEventsCmd() *cobra.Command {
	var follow, asJSON bool
	c := &cobra.Command{
		Use:   "events TRIAL [--follow] [--json]",
		Short: "Show a trial's events: tunnels and refusals, API calls, commands, the agent, its start and end",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := rootConfig("trial events")
			if err != nil {
				return err
			}
			q := url.Values{}
			if follow {
				q.Set("follow", "1")
			}
			req, _ := http.NewRequest("GET", "http://controller/v1/trials/"+url.PathEscape(args[0])+"/events?"+q.Encode(), nil)
			resp, err := ctlClient(cfg).Do(req)
			if err != nil {
				return fmt.Errorf("trial events: %w", ctlUnreachable(cfg, err))
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("trial events: %s", problemDetail(resp.Body))
			}
			return printEvents(os.Stdout, resp.Body, asJSON)
		},
	}
	c.Flags().BoolVar(&follow, "follow", false, "go on showing events as they are recorded, until the trial ends")
	c.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line, as the ledger holds it")
	return c
}

// printEvents writes each event of the controller's NDJSON stream as it
// comes: its line, or its JSON.
func printEvents(w io.Writer, stream io.Reader, asJSON bool) error {
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var e ledger.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("trial events: the controller sent an event that is not JSON: %w", err)
		}
		if asJSON {
			// The agent's strings may hold C1 and bidi controls, which
			// encoding/json leaves raw: escaped, the line is the same JSON.
			b, _ := json.Marshal(e)
			fmt.Fprintf(w, "%s\n", termsafe.JSON(b))
		} else {
			fmt.Fprintln(w, eventLine(e))
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("trial events: the controller's stream broke off: %w", err)
	}
	return nil
}

// eventLine is one event as the operator reads it: when, what, and its
// facts; whatever the agent chose (a host, a step's text) escaped.
func eventLine(e ledger.Event) string {
	d := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(e.Data))
	dec.UseNumber()
	dec.Decode(&d)
	return fmt.Sprintf("%s  %-17s  %s", e.At.UTC().Format("2006-01-02 15:04:05.000"), termsafe.Line(e.Kind), termsafe.Line(eventFacts(e.Kind, d)))
}

// eventFacts are an event's key facts in a few words.
func eventFacts(kind string, d map[string]any) string {
	s := func(k string) string {
		if v, ok := d[k]; ok && v != nil {
			return fmt.Sprint(v)
		}
		return "?"
	}
	// ran says how a command or an agent ended.
	ran := func() string {
		out := "exit " + s("exit_code")
		if st := s("stopped"); st != "?" && st != "" && st != "exited" {
			out += " (" + st + ")"
		}
		return out + " after " + s("wall_ms") + " ms"
	}
	switch kind {
	case "trial.start":
		return fmt.Sprintf("lane %s: %s files, %s bytes copied", s("lane"), s("files"), s("bytes"))
	case "trial.end":
		out := s("reason")
		if _, ok := d["processes_stopped"]; ok {
			out += fmt.Sprintf("; %s processes stopped, its folders held %s bytes", s("processes_stopped"), s("disk_bytes"))
		}
		if n := s("events_unrecorded"); n != "?" && n != "0" {
			out += fmt.Sprintf("; %s API calls and tunnels not recorded", n)
		}
		return out
	case "trial.exec":
		return fmt.Sprintf("%s as %s: %s", s("argv0"), s("role"), ran())
	case "trial.agent.start":
		return fmt.Sprintf("%s as %s (harness %s)", s("argv0"), s("role"), s("harness"))
	case "trial.agent":
		return fmt.Sprintf("%s as %s (harness %s) ended: %s", s("argv0"), s("role"), s("harness"), ran())
	case "egress.open":
		return fmt.Sprintf("tunnel to %s via %s opened (%s)", s("target"), s("via"), s("address"))
	case "egress":
		return fmt.Sprintf("tunnel to %s via %s closed: %s bytes sent, %s received, %s ms", s("target"), s("via"), s("bytes_sent"), s("bytes_received"), s("ms"))
	case "egress.refused":
		return fmt.Sprintf("tunnel to %s via %s refused: %s", s("target"), s("via"), s("why"))
	case "api":
		out := fmt.Sprintf("%s (%s): %s in %s ms", s("route"), s("id"), s("status"), s("ms"))
		if tool := s("tool"); tool != "?" {
			out = "MCP tool " + tool + ": " + out
		}
		return out
	case "step":
		return s("kind") + ": " + clip(s("text"), 160)
	case "fetch":
		return fmt.Sprintf("%s: %s, %s bytes", s("url"), s("status"), s("bytes"))
	case "fetch.refused":
		return fmt.Sprintf("%s: %s", s("url"), s("error"))
	case "research.note":
		return fmt.Sprintf("%q (%s)", s("title"), s("path"))
	case "security.decoy":
		return fmt.Sprintf("the decoy credential in the %s of %s", s("place"), s("route"))
	case "events.unrecorded":
		return s("why")
	}
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"="+s(k))
	}
	return strings.Join(parts, " ")
}

// clip cuts s to at most n runes, saying so.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

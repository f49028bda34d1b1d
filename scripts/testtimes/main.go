// Command testtimes reads `go test -json` on its standard input and prints
// what a plain `go test` would (each package's ok or FAIL line, the output
// of failing tests, skipped tests' reasons left out), then each package's
// time and the slowest tests, so CI's log shows where its minutes go. It
// exits 1 when any test or package failed, so a pipeline with pipefail
// keeps go test's verdict.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// event is one line of test2json.
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// timing is a package's or a test's time.
type timing struct {
	name    string
	seconds float64
}

func main() {
	top := flag.Int("slowest", 25, "how many of the slowest tests to list")
	flag.Parse()
	failed, err := relay(os.Stdin, os.Stdout, *top)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// relay copies a plain go test's output from r's events to w, then the
// times, and reports whether anything failed.
func relay(r io.Reader, w io.Writer, top int) (failed bool, err error) {
	held := map[string][]string{} // a running test's output, kept until it ends
	var packages, tests []timing
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			// go test's own lines (a build failure) pass through as they are.
			fmt.Fprintln(w, sc.Text())
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "output" && e.Test != "":
			held[key] = append(held[key], e.Output)
		case e.Action == "output":
			// A package's own lines: its ok/FAIL line, a panic, a build error.
			if !strings.HasPrefix(e.Output, "=== ") && !strings.HasPrefix(e.Output, "PASS\n") {
				fmt.Fprint(w, e.Output)
			}
		case e.Test != "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			if e.Action == "fail" {
				failed = true
				for _, l := range held[key] {
					fmt.Fprint(w, l)
				}
			}
			delete(held, key)
			if e.Action != "skip" && !strings.Contains(e.Test, "/") {
				tests = append(tests, timing{e.Package + " " + e.Test, e.Elapsed})
			}
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			failed = failed || e.Action == "fail"
			packages = append(packages, timing{e.Package, e.Elapsed})
		}
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	// A test still running when its package died (a timeout's panic).
	for key, lines := range held {
		fmt.Fprintf(w, "--- (unfinished) %s\n%s", key, strings.Join(lines, ""))
		failed = true
	}
	byTime := func(a, b timing) int { return cmp.Compare(b.seconds, a.seconds) }
	slices.SortFunc(packages, byTime)
	slices.SortFunc(tests, byTime)
	fmt.Fprintln(w, "\ntest times: packages, slowest first")
	for _, p := range packages {
		fmt.Fprintf(w, "  %8.1fs  %s\n", p.seconds, p.name)
	}
	fmt.Fprintf(w, "test times: the %d slowest tests\n", min(top, len(tests)))
	for _, t := range tests[:min(top, len(tests))] {
		fmt.Fprintf(w, "  %8.1fs  %s\n", t.seconds, t.name)
	}
	return failed, nil
}

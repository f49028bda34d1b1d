package main

import (
	"strings"
	"testing"
)

// TestRelayKeepsGoTestsVerdictAndTimes: a passing test's chatter is left
// out, a failing test's output and the package lines are kept, the verdict
// is failed, and both times are listed slowest first.
func TestRelayKeepsGoTestsVerdictAndTimes(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p/a","Test":"TestQuick"}`,
		`{"Action":"output","Package":"p/a","Test":"TestQuick","Output":"=== RUN   TestQuick\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestQuick","Output":"chatter\n"}`,
		`{"Action":"pass","Package":"p/a","Test":"TestQuick","Elapsed":0.5}`,
		`{"Action":"output","Package":"p/a","Test":"TestSlow","Output":"    x_test.go:9: want 2, got 3\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSlow","Output":"--- FAIL: TestSlow (7.00s)\n"}`,
		`{"Action":"fail","Package":"p/a","Test":"TestSlow","Elapsed":7}`,
		`{"Action":"output","Package":"p/a","Output":"FAIL\tp/a\t7.6s\n"}`,
		`{"Action":"fail","Package":"p/a","Elapsed":7.6}`,
		`{"Action":"output","Package":"p/b","Output":"ok  \tp/b\t9.1s\n"}`,
		`{"Action":"pass","Package":"p/b","Elapsed":9.1}`,
		`# p/c`,
	}, "\n")
	var out strings.Builder
	failed, err := relay(strings.NewReader(in), &out, 5)
	if err != nil || !failed {
		t.Fatalf("failed %v, err %v; want failed", failed, err)
	}
	s := out.String()
	for _, want := range []string{"want 2, got 3", "--- FAIL: TestSlow", "FAIL\tp/a\t7.6s", "ok  \tp/b\t9.1s", "# p/c", "     9.1s  p/b\n", "     7.0s  p/a TestSlow\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "chatter") || strings.Contains(s, "=== RUN") {
		t.Errorf("a passing test's output was printed:\n%s", s)
	}
	if strings.Index(s, "p/b\n") > strings.Index(s, "p/a\n") {
		t.Errorf("packages not slowest first:\n%s", s)
	}
}

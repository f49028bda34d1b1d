package cpuset

import "testing"

func TestParseAndPrint(t *testing.T) {
	for in, want := range map[string]string{"0": "0", "0-3,8": "0-3,8", "3,1,2": "1-3", " 5 ": "5", "": ""} {
		s, err := Parse(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if s.String() != want {
			t.Errorf("%q: got %q, want %q", in, s.String(), want)
		}
	}
	for _, bad := range []string{"a", "3-1", "-1", "1-", "99999"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSetOps(t *testing.T) {
	a, _ := Parse("0-3")
	b, _ := Parse("2,3")
	if !a.Contains(b) || b.Contains(a) {
		t.Fatal("Contains")
	}
	if a.Minus(b).String() != "0-1" {
		t.Fatal("Minus")
	}
	if !a.Intersects(b) {
		t.Fatal("Intersects")
	}
	c, _ := Parse("7")
	if a.Intersects(c) {
		t.Fatal("Intersects disjoint")
	}
}

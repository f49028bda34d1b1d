package kit

import (
	"encoding/json"
	"strings"
	"testing"
)

func checkKit() *Kit {
	return &Kit{Name: "sum", Check: Check{Hidden: []string{"case3", "secret-total"}, Public: "score"}}
}

func TestParseCheckSplits(t *testing.T) {
	out := []byte(`
	{"score": 0.5,
	 "cases": {"case1": {"ok": true, "ms": 12},
	           "case2": {"ok": false},
	           "case3": {"ok": false, "detail": "hidden detail"},
	           "secret-total": 0.25}}
	`)
	pub, hidden, err := ParseCheck(out, checkKit())
	if err != nil {
		t.Fatal(err)
	}
	if pub.Name != "score" || pub.Score != 0.5 || len(pub.Cases) != 2 {
		t.Fatalf("public: %+v", pub)
	}
	if string(pub.Cases["case1"]) != `{"ok":true,"ms":12}` || string(pub.Cases["case2"]) != `{"ok":false}` {
		t.Fatalf("public cases: %s %s", pub.Cases["case1"], pub.Cases["case2"])
	}
	if len(hidden) != 2 || string(hidden["case3"]) != `{"ok":false,"detail":"hidden detail"}` || string(hidden["secret-total"]) != "0.25" {
		t.Fatalf("hidden: %q", hidden)
	}
	b, err := json.Marshal(pub)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"score":0.5,"cases":{"case1":{"ok":true,"ms":12},"case2":{"ok":false}}}` {
		t.Fatalf("marshal: %s", b)
	}
	if strings.Contains(string(b), "hidden detail") {
		t.Fatal("a hidden result reached the public form")
	}
}

func TestParseCheckHiddenNotReported(t *testing.T) {
	pub, hidden, err := ParseCheck([]byte(`{"score": 3, "cases": {"case1": null}}`), checkKit())
	if err != nil || len(hidden) != 0 || pub.Score != 3 || string(pub.Cases["case1"]) != "null" {
		t.Fatalf("%+v %v %v", pub, hidden, err)
	}
	// No cases at all is fine too.
	pub, hidden, err = ParseCheck([]byte(`{"score": -1e3}`+"\n"), checkKit())
	if err != nil || len(hidden) != 0 || len(pub.Cases) != 0 || pub.Score != -1000 {
		t.Fatalf("%+v %v %v", pub, hidden, err)
	}
	b, _ := json.Marshal(pub)
	if string(b) != `{"score":-1000,"cases":{}}` {
		t.Fatalf("%s", b)
	}
}

func TestParseCheckOtherPublicName(t *testing.T) {
	k := checkKit()
	k.Check.Public = "speedup"
	pub, _, err := ParseCheck([]byte(`{"speedup": 1.25, "cases": {}}`), k)
	if err != nil || pub.Name != "speedup" || pub.Score != 1.25 {
		t.Fatal(pub, err)
	}
	if _, _, err := ParseCheck([]byte(`{"score": 1}`), k); err == nil || err.Error() != `check of kit "sum": member "score" is neither "speedup" nor "cases"` {
		t.Fatal(err)
	}
}

func TestParseCheckRefusals(t *testing.T) {
	for _, c := range []struct{ out, want string }{
		{``, "the check printed nothing (want one JSON object)"},
		{"  \n", "the check printed nothing (want one JSON object)"},
		{`score: 1`, "the output is not a JSON object"},
		{`[1]`, "the output is not a JSON object"},
		{`{"score": 1, "cases": {"case3": "SECRET"`, "the output is not one JSON object (unexpected end or invalid JSON)"},
		{`{"score": 1, "cases": {"case3": SECRET}}`, "the output is not one JSON object (syntax error at byte 33)"},
		{`{"score": 1} {"score": 2}`, "the output holds more than one JSON object"},
		{`{"score": 1} trailing SECRET`, "the output holds more than one JSON object"},
		{`{"cases": {}}`, `no "score" member`},
		{`{"score": "1"}`, `"score" is not a number`},
		{`{"score": null}`, `"score" is not a number`},
		{`{"score": 1, "total": 2}`, `member "total" is neither "score" nor "cases"`},
		{`{"score": 1, "cases": ["case1"]}`, `"cases" is not a JSON object`},
		{`{"score": 1, "cases": null}`, `"cases" is not a JSON object`},
		{`{"score": 1, "cases": {"": 1}}`, "a case has an empty name"},
		{`{"score": 1e999}`, `"score" is not a number`},
	} {
		_, _, err := ParseCheck([]byte(c.out), checkKit())
		want := `check of kit "sum": ` + c.want
		if err == nil || err.Error() != want {
			t.Errorf("%q:\n got %v\nwant %s", c.out, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%q: the error quotes the output: %v", c.out, err)
		}
	}
	big := make([]byte, MaxCheckOutput+1)
	if _, _, err := ParseCheck(big, checkKit()); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatal(err)
	}
}

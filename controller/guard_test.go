package controller

import (
	"net/http/httptest"
	"strings"
	"testing"

	"thermite/controller/ledger"
)

func TestDecoySeenInEveryForm(t *testing.T) {
	id, secret := decoyPair()
	tr := ledger.Trial{DecoyKeyID: id, DecoySecret: secret}
	cases := map[string]struct {
		target string
		body   string
	}{
		"in the body":              {"/v1/steps", `{"kind":"x","text":"` + id + `"}`},
		"JSON-escaped":             {"/v1/steps", `{"kind":"x","text":"\u0041` + id[1:] + `"}`},
		"percent-escaped in a URL": {"/v1/fetch", `{"url":"https://example.com/?k=%41` + id[1:] + `"}`},
		"the secret":               {"/v1/steps", `{"kind":"x","text":"` + secret + `"}`},
		"in the query":             {"/v1/trial?x=" + id, ``},
	}
	for name, c := range cases {
		r := httptest.NewRequest("POST", c.target, strings.NewReader(c.body))
		if DecoySeen(tr, r, []byte(c.body)) == "" {
			t.Errorf("%s: not seen", name)
		}
	}
	r := httptest.NewRequest("POST", "/v1/steps", strings.NewReader(`{"kind":"x","text":"AKIA0000000000000000"}`))
	if p := DecoySeen(tr, r, []byte(`{"kind":"x","text":"AKIA0000000000000000"}`)); p != "" {
		t.Errorf("another key seen as the decoy: %s", p)
	}
	r = httptest.NewRequest("GET", "/v1/trial", nil)
	r.Header.Set("X-Api-Key", secret)
	if DecoySeen(tr, r, nil) == "" {
		t.Error("in a header: not seen")
	}
}

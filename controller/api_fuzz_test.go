package controller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"thermite/controller/ledger"
	"thermite/internal/config"
	"thermite/internal/lanefs"
)

// apiBody is one kind of request body the harness API decodes, with the
// limit its route reads it under.
type apiBody struct {
	route string
	limit int64
	new   func() any
}

// apiBodies are every request type the harness API (and the operator's
// routes beside it) decode, with their routes' real limits.
func apiBodies() []apiBody {
	api := config.Default().API
	body, step := api.MaxBodyBytes, api.MaxStepBytes+4096
	bodies := []apiBody{
		{"/v1/steps", step, func() any { return new(StepRequest) }},
		{"/v1/research/note", step, func() any { return new(NoteRequest) }},
		{"/v1/fetch", 64 << 10, func() any { return new(FetchRequest) }},
		{"/v1/exec", body, func() any { return new(ExecRequest) }},
	}
	for _, op := range lanefs.Ops {
		bodies = append(bodies, apiBody{"/v1/fs/" + op.Name, body, op.NewRequest})
	}
	return append(bodies,
		apiBody{"operator start", body, func() any { return new(StartRequest) }},
		apiBody{"operator end", body, func() any { return new(EndRequest) }},
	)
}

// decodeAs runs the API's decode on body as route b would, under limit.
func decodeAs(b apiBody, limit int64, body []byte) (any, *httptest.ResponseRecorder, bool) {
	v := b.new()
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/v1/x", bytes.NewReader(body))
	return v, w, decode(w, r, limit, v)
}

// FuzzAPIBody decodes any body as each request type the harness API
// takes, under the route's own limit or a small one (so that the limit
// is reached). A body is either accepted with nothing answered yet, and
// then what it decoded to encodes and decodes again to the same request,
// or refused with 400, or 413 when it is over the limit, and one JSON
// RFC 9457 problem line that names no type of the server's.
func FuzzAPIBody(f *testing.F) {
	f.Add(uint8(0), []byte(`{"kind":"thought","text":"trying the tests"}`))
	f.Add(uint8(3), []byte(`{"argv":["make","test"],"timeout_ms":60000}`))
	f.Add(uint8(5), []byte(`{"path":"a.txt","data":"aGk=","mode":420}`))
	f.Add(uint8(0x80), []byte(`{"kind":"`+strings.Repeat("x", 100)+`"}`))
	bodies := apiBodies()
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		b := bodies[int(route&0x7f)%len(bodies)]
		limit := b.limit
		if route&0x80 != 0 {
			limit = 64
		}
		v, w, ok := decodeAs(b, limit, body)
		if ok {
			if w.Body.Len() != 0 {
				t.Fatalf("%s: accepted, yet answered %d %q", b.route, w.Code, w.Body)
			}
			enc, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("%s: an accepted request does not encode: %v", b.route, err)
			}
			again, _, ok := decodeAs(b, int64(len(enc))+1, enc)
			if !ok {
				t.Fatalf("%s: the re-encoded request %s is refused", b.route, enc)
			}
			if !reflect.DeepEqual(v, again) {
				t.Fatalf("%s: round trip changed the request:\n%#v\n%#v", b.route, v, again)
			}
			return
		}
		switch w.Code {
		case http.StatusBadRequest:
		case http.StatusRequestEntityTooLarge:
			if int64(len(body)) <= limit {
				t.Fatalf("%s: 413 for a body of %d bytes, within the limit of %d", b.route, len(body), limit)
			}
		default:
			t.Fatalf("%s: refused with %d", b.route, w.Code)
		}
		var answer Problem
		if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil || answer.Status != w.Code || answer.Code == "" || answer.Detail == "" ||
			w.Header().Get("Content-Type") != "application/problem+json" || bytes.Count(w.Body.Bytes(), []byte("\n")) != 1 {
			t.Fatalf("%s: the refusal is not one problem line: %q", b.route, w.Body)
		}
		if strings.Contains(answer.Detail, "lanefs.") || strings.Contains(answer.Detail, "controller.") || strings.Contains(answer.Detail, "Go value") {
			t.Fatalf("%s: the refusal names the server's own types: %q", b.route, answer.Detail)
		}
	})
}

// The decoy a fuzzed request hides; fixed, so that a crash reproduces.
const (
	fuzzDecoyID     = "AKIAZ7Q2JX4M5N6P3R2T"
	fuzzDecoySecret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
)

// hide writes s with each byte in the form that form's bytes choose in
// turn: as it is, as a JSON \u escape, percent-escaped, both (a JSON
// escape of the percent sign), or percent-escaped twice. Every one of
// them is a form DecoySeen promises to see once the body's strings are
// decoded.
func hide(s string, form []byte) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		k := byte(0)
		if len(form) > 0 {
			k = form[i%len(form)] % 5
		}
		switch k {
		case 0:
			b.WriteByte(c)
		case 1:
			fmt.Fprintf(&b, `\u%04x`, c)
		case 2:
			fmt.Fprintf(&b, "%%%02X", c)
		case 3:
			fmt.Fprintf(&b, `\u0025%02x`, c)
		case 4:
			fmt.Fprintf(&b, "%%25%02X", c)
		}
	}
	return b.String()
}

// FuzzDecoySeen hides a trial's decoy key id (or secret) in a JSON
// string of a request body, surrounded by anything, each byte in a form
// of the fuzzer's choosing. Wherever the body decodes as JSON, the
// request carries the decoy and DecoySeen must name a place.
func FuzzDecoySeen(f *testing.F) {
	f.Add(`{"url":"https://example.com/?k=`, `"}`, []byte{0}, false)
	f.Add(`{"kind":"x","text":"`, `"}`, []byte{1, 2, 3}, true)
	f.Add(`{"url":"https://example.com/?a=%zz&k=`, `"}`, []byte{2}, false)
	f.Fuzz(func(t *testing.T, before, after string, form []byte, secret bool) {
		decoy := fuzzDecoyID
		if secret {
			decoy = fuzzDecoySecret
		}
		body := []byte(before + hide(decoy, form) + after)
		var doc any
		if json.Unmarshal(body, &doc) != nil || !anyString(doc, func(s string) bool {
			return strings.Contains(s, decoy) || strings.Contains(percentDecoded(s), decoy) || strings.Contains(percentDecoded(percentDecoded(s)), decoy)
		}) {
			return // not a request that carries the decoy in a form on the list
		}
		tr := ledger.Trial{DecoyKeyID: fuzzDecoyID, DecoySecret: fuzzDecoySecret}
		r := httptest.NewRequest("POST", "/v1/fetch", bytes.NewReader(body))
		if DecoySeen(tr, r, body) == "" {
			t.Fatalf("the decoy in %q is not seen", body)
		}
	})
}

// percentDecoded undoes every well-formed %XX in s and leaves the rest:
// what a server at the other end of a fetch reads, whatever else the URL
// holds.
func percentDecoded(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && ishex(s[i+1]) && ishex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

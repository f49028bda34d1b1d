package controller

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/controller/fetch"
	"thermite/internal/config"
)

// apiDoc is the document as a client reads it.
func apiDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(OpenAPIJSON(), &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

func docMap(v any, keys ...string) map[string]any {
	for _, k := range keys {
		v = v.(map[string]any)[k]
	}
	m, _ := v.(map[string]any)
	return m
}

func testAPI() (*Controller, http.Handler) {
	c := &Controller{cfg: config.Default(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return c, c.apiGate(c.apiRoutes())
}

func serveAPI(h http.Handler, method, path, auth string, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestOpenAPIDocumentIsCurrent: docs/openapi.json is what the server
// answers on GET /v1/openapi.json, byte for byte.
func TestOpenAPIDocumentIsCurrent(t *testing.T) {
	file, err := os.ReadFile("../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	_, h := testAPI()
	w := serveAPI(h, "GET", "/v1/openapi.json", "", "")
	if w.Code != 200 || !bytes.Equal(w.Body.Bytes(), OpenAPIJSON()) {
		t.Fatalf("GET /v1/openapi.json: %d, not the document", w.Code)
	}
	if !bytes.Equal(file, OpenAPIJSON()) {
		t.Fatal("docs/openapi.json is not the server's document: go run ./cmd/thermite openapi > docs/openapi.json")
	}
	if v := apiDoc(t)["openapi"]; v != "3.1.0" {
		t.Fatalf("openapi %v", v)
	}
}

// TestOpenAPIListsEveryRouteAndNothingElse asks the server every path
// the document lists with every method: a documented one is served (401
// without a token where it takes one), any other is 405 with an Allow
// header of exactly the documented ones, and a path the document lacks
// is 404; every answer but the document itself is a problem.
func TestOpenAPIListsEveryRouteAndNothingElse(t *testing.T) {
	_, h := testAPI()
	doc := apiDoc(t)
	paths := docMap(doc, "paths")
	c := &Controller{}
	if len(paths) == 0 || len(c.apiTable()) < len(paths) {
		t.Fatalf("%d paths in the document", len(paths))
	}
	for path, item := range paths {
		var documented []string
		for m := range item.(map[string]any) {
			documented = append(documented, strings.ToUpper(m))
		}
		sort.Strings(documented)
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"} {
			w := serveAPI(h, m, path, "", "")
			switch {
			case slices.Contains(documented, m):
				op := docMap(item, strings.ToLower(m))
				want := 401
				if len(op["security"].([]any)) == 0 {
					want = 200
				}
				if w.Code != want {
					t.Errorf("%s %s: %d, want %d", m, path, w.Code, want)
				}
				if _, ok := docMap(op, "responses")[strconv.Itoa(w.Code)]; !ok && w.Code != 200 {
					t.Errorf("%s %s: %d is not among its documented responses", m, path, w.Code)
				}
			case w.Code != 405:
				t.Errorf("%s %s: %d, want 405: it is not in the document", m, path, w.Code)
			default:
				allow := strings.Split(w.Header().Get("Allow"), ", ")
				sort.Strings(allow)
				if !slices.Equal(allow, documented) {
					t.Errorf("%s %s: Allow %v, want %v", m, path, allow, documented)
				}
			}
			if w.Code != 200 {
				wantProblem(t, w, m+" "+path)
			}
		}
	}
	for _, path := range []string{"/v1/nothing", "/v1/fs/chmod", "/v1/trials", "/", "/v1/fs/read/x"} {
		w := serveAPI(h, "POST", path, "", "{}")
		if w.Code != 404 || wantProblem(t, w, path).Code != CodeNoRoute {
			t.Errorf("POST %s: %d %s, want 404 no_route", path, w.Code, w.Body)
		}
	}
}

// wantProblem checks an answer is one RFC 9457 problem line.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, what string) Problem {
	t.Helper()
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Header().Get("Content-Type") != "application/problem+json" ||
		p.Status != w.Code || p.Type != problemType+p.Code || !slices.Contains(problemCodes, p.Code) || p.Detail == "" {
		t.Errorf("%s: %d %q is not a problem with a known code", what, w.Code, w.Body)
	}
	return p
}

// TestAPIRequestFieldsAreTheDocumentsOnly: each route's request schema
// lists exactly the fields its decoder takes (never the file helper's
// root), the decoder takes a body with all of them, and refuses one more
// field, root, and a field named in another case, with code unknown_field.
func TestAPIRequestFieldsAreTheDocumentsOnly(t *testing.T) {
	doc := apiDoc(t)
	schemas := docMap(doc, "components", "schemas")
	for _, rt := range (&Controller{}).apiTable() {
		if rt.Request == nil {
			continue
		}
		s := docMap(schemas, rt.ID+"_request")
		var props []string
		body := map[string]any{}
		for name, p := range docMap(s, "properties") {
			props = append(props, name)
			body[name] = sample(p.(map[string]any))
		}
		sort.Strings(props)
		fields := jsonFields(reflect.TypeOf(rt.Request), rt.Hidden)
		sort.Strings(fields)
		if !slices.Equal(props, fields) || slices.Contains(props, "root") || s["additionalProperties"] != false {
			t.Errorf("%s: document %v, decoder %v", rt.Path, props, fields)
		}
		fresh := func() any { return reflect.New(reflect.TypeOf(rt.Request).Elem()).Interface() }
		b, _ := json.Marshal(body)
		if e := decodeStrict(bytes.NewReader(b), 1<<20, fresh(), rt.Hidden); e != nil {
			t.Errorf("%s: a body of every documented field %s refused: %s", rt.Path, b, e.msg)
		}
		for _, extra := range []string{"root", "sudo", strings.ToUpper(props[0][:1]) + props[0][1:]} {
			if slices.Contains(props, extra) {
				continue
			}
			with := map[string]any{extra: 0}
			b, _ := json.Marshal(with)
			if e := decodeStrict(bytes.NewReader(b), 1<<20, fresh(), rt.Hidden); e == nil || e.code != CodeUnknownField || e.status != 400 {
				t.Errorf("%s: field %q taken (%+v)", rt.Path, extra, e)
			}
		}
	}
}

// sample is a value of a schema's type.
func sample(p map[string]any) any {
	switch p["type"] {
	case "string":
		if p["contentEncoding"] == "base64" {
			return []byte("x")
		}
		return "x"
	case "integer":
		return 1
	case "boolean":
		return true
	case "array":
		return []any{sample(p["items"].(map[string]any))}
	}
	return map[string]any{}
}

// TestAPIResponseFieldsAreDocumented: every field a route's answer can
// hold is a property of its documented schema, and nothing else is.
func TestAPIResponseFieldsAreDocumented(t *testing.T) {
	schemas := docMap(apiDoc(t), "components", "schemas")
	for _, rt := range (&Controller{}).apiTable() {
		typ := reflect.TypeOf(rt.Response)
		if typ.Kind() != reflect.Struct {
			continue
		}
		name := typ.Name()
		var props []string
		for p := range docMap(schemas, name, "properties") {
			props = append(props, p)
		}
		fields := jsonFields(typ, nil)
		sort.Strings(props)
		sort.Strings(fields)
		if !slices.Equal(props, fields) {
			t.Errorf("%s answers %s %v, documented %v", rt.Path, name, fields, props)
		}
	}
}

// TestAPIRefusalsNameNoServerTypes: a body of the wrong shape is refused
// in the words of JSON, as a problem, never with the server's own names.
func TestAPIRefusalsNameNoServerTypes(t *testing.T) {
	for body, want := range map[string]string{
		`[]`:                        "got a JSON array, want an object",
		`{"path":["a"]}`:            "field path: got a JSON array, want a string",
		`{"path":"a","offset":"1"}`: "field offset: got a JSON string, want an integer",
		`{"path":"a"} {}`:           "the body must be one JSON object",
		`null`:                      "got null",
		`{"path":"a","root":1}`:     `field "root" is not one this route takes`,
	} {
		v := reflect.New(reflect.TypeOf((&Controller{}).apiTable()[2].Request).Elem()).Interface()
		e := decodeStrict(strings.NewReader(body), 1<<20, v, []string{"root"})
		if e == nil || !strings.Contains(e.msg, want) || strings.Contains(e.msg, "lanefs") || strings.Contains(e.msg, "Go ") {
			t.Errorf("%s: %+v, want %q", body, e, want)
		}
	}
}

// TestOtherAuthSchemesRefused: a header with another scheme, or with no
// token, is 401 before any token is looked up (the case of "Bearer" is
// free: the end-to-end test sends "bearer").
func TestOtherAuthSchemesRefused(t *testing.T) {
	c, h := testAPI()
	for _, a := range []string{"", "Basic abc", "Bearer", "Bearer ", "Token abc", "Bearerabc"} {
		if c.TrialForToken(a) != nil {
			t.Errorf("%q accepted", a)
		}
		if w := serveAPI(h, "GET", "/v1/trial", a, ""); w.Code != 401 || w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%q: %d", a, w.Code)
		}
	}
}

// TestFetchRefusalsNameTheRigsKeys: a fetch over its size or time is
// refused naming the rig's configuration key, not the fetcher's fields.
func TestFetchRefusalsNameTheRigsKeys(t *testing.T) {
	big := fetchDetail(&fetch.TooLargeError{URL: "https://x.test/", Limit: 5})
	slow := fetchDetail(&fetch.TimeoutError{URL: "https://x.test/", Limit: time.Second})
	if !strings.Contains(big, "api.fetch_max_bytes of 5") || strings.Contains(big, "MaxBytes") ||
		!strings.Contains(slow, "api.fetch_timeout of 1s") || strings.Contains(slow, "(Timeout)") {
		t.Fatalf("%q %q", big, slow)
	}
}
